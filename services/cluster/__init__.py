"""The Ray cluster under the platform: starting a node (head or joined), what engines a node can
run (its capability resources), and the ports a platform needs on a machine."""
