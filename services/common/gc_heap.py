"""Keep the token path's processes out of long garbage-collector pauses.

A replica's heap after start-up is millions of objects that live as long as the process (Ray,
grpc, FastAPI, and in a worker torch, transformers and vLLM's front end). Python's oldest-generation
collection walks every one of them: a stall of hundreds of milliseconds in the middle of a token
stream, every time enough young objects have survived (`bench/gc_pause.py` measures it). vLLM's own
server and EngineCore move their start-up heap out of the collector's reach (`gc.freeze()` after
warm-up); a process that serves tokens here does the same once it is ready to serve. What it
allocates afterwards is collected as usual.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_startup_heap(what: str) -> int:
    """Collect what start-up left as garbage, then freeze the rest (the permanent generation, never
    scanned again); returns how many objects are frozen now."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d start-up objects frozen out of the garbage collector's scans (%.0f ms)", what, frozen,
             1000 * (time.perf_counter() - t0))
    return frozen
