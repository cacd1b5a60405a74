"""Build builtin models into the cache ahead of time: python -m services.worker.builtin [NAME ...]"""

from __future__ import annotations

import logging
import sys
import time

from services.worker.builtin import BUILTIN_PREFIX, builtin_names, resolve_model_ref


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in argv or builtin_names():
        t0 = time.monotonic()
        path = resolve_model_ref(BUILTIN_PREFIX + name.removeprefix(BUILTIN_PREFIX))
        print(f"{BUILTIN_PREFIX}{name}: {path} ({time.monotonic() - t0:.1f}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
