"""gRPC ignores a channel or server option it does not know, without a word: a misspelt key leaves
gRPC's default in force. (A misspelt ping-policy key once let the worker answer an idle delivery
stream's keepalive pings with GOAWAY "too many pings".) Every option key the platform sets must be
one that gRPC's core knows: each is a C string literal in its compiled library."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
OPTION_KEY = re.compile(r"grpc\.[a-z0-9_.]+")


def option_keys() -> dict[str, str]:
    """Each option key set in services/ and clients/ (the first item of a `(key, value)` pair) and
    where it is."""
    keys: dict[str, str] = {}
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("clients/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant) \
                    and isinstance(node.elts[0].value, str) and OPTION_KEY.fullmatch(node.elts[0].value):
                keys.setdefault(node.elts[0].value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return keys


def test_every_grpc_option_key_the_platform_sets_is_known_to_grpc() -> None:
    keys = option_keys()
    assert "grpc.keepalive_time_ms" in keys  # the scan finds what is set
    (core,) = Path(grpc.__file__).parent.joinpath("_cython").glob("cygrpc*.so")
    known = core.read_bytes()
    unknown = {key: where for key, where in keys.items() if key.encode() + b"\0" not in known}
    assert not unknown, f"gRPC does not know these option keys (it would ignore them): {unknown}"
    assert b"grpc.http2.min_recv_ping_interval_without_data_ms\0" not in known  # the check can fail
