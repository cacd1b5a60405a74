"""The gateway's protocol layer is pure: importing every `protocol*` module (and the shared
`protocol_common` package, and so everything they import) in a fresh interpreter loads neither
FastAPI, Starlette nor grpc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "services" / "gateway"
BANNED = ("fastapi", "starlette", "grpc")


def protocol_modules() -> list[str]:
    paths = {*GATEWAY.glob("**/protocol*.py"), *(GATEWAY / "protocol_common").glob("*.py")}
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths)


def test_every_endpoint_has_its_protocol():
    modules = protocol_modules()
    for endpoint in ("chat", "completions", "embeddings", "models", "responses"):
        assert f"services.gateway.{endpoint}.protocol" in modules


def test_protocol_modules_import_no_fastapi_starlette_or_grpc():
    code = ("import importlib, sys\n"
            f"for name in {protocol_modules()!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(BANNED)!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"a protocol module pulls in {out.stdout.strip()}"
