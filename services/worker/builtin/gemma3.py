"""placeholder"""
BUILD_VERSION = "1"
def build(out_dir):
    raise NotImplementedError
