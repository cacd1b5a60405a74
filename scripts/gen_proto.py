"""Generate the Python code of proto/ into the `mship` package (committed; never edit by hand).

Usage: python scripts/gen_proto.py [OUT_DIR]   (default: the repository root)
The staleness test runs this into a temporary directory and compares.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE_DOC = '"""Generated from proto/ by `make proto`. Do not edit."""\n'


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py and package __init__ files under `out`."""
    include = str(resources.files("grpc_tools") / "_proto")
    files = [str(p.relative_to(PROTO_DIR)) for p in proto_files()]
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for rel in files:
        pkg = (out / rel).parent
        while pkg != out:
            init = pkg / "__init__.py"
            if not init.exists():
                init.write_text(PACKAGE_DOC)
            pkg = pkg.parent
    for path in sorted((out / "mship").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".pyi"}:
            written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for p in generate(target):
        print(p.relative_to(target))
