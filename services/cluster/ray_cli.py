"""`python -m services.cluster.ray_cli start ...`: Ray's own `ray start`, keeping a loopback
`--node-ip-address` as given.

Ray's CLI rewrites 127.0.0.1 to the machine's routable address, so a node meant for loopback (a
single-machine platform, co-located nodes, the tests) would listen on every interface. With the
address kept, Ray's GCS and raylet listen on loopback only.
"""

from __future__ import annotations

import sys


def main() -> None:
    from ray._private import services
    from ray.scripts.scripts import main as ray_main

    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", *sys.argv[1:]]
    ray_main()


if __name__ == "__main__":
    main()
