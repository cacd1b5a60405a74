"""The layout keeps its promises: clients depend on contracts and the shared vocabulary only, and
no hand-written module grows past the size one reader can hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
# What a client may import from this repository: generated stubs, services.common (errors, routing,
# the Infer call, the vocabulary), the launcher that `mship start` runs in-process and the Ray node
# processes (services.cluster) that `mship start` / `mship join` run.
CLIENT_MAY_IMPORT = ("mship.", "services.common.", "services.launcher", "services.cluster.", "clients.")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_clients_import_only_contracts_common_and_the_launcher():
    ours = ("mship", "services", "clients")
    bad = {f"{path.relative_to(ROOT)}: {name}"
           for path in sorted((ROOT / "clients").glob("**/*.py")) for name in _imports(path)
           if name.split(".")[0] in ours and not (name + ".").startswith(CLIENT_MAY_IMPORT)
           and name != "services"}
    assert not bad, f"clients/ reaches into service internals: {sorted(bad)}"


def test_the_client_modules_import_without_the_service_internals():
    """Importing the CLI and the Python client loads no gateway or worker module (nor FastAPI)."""
    code = ("import sys, clients.cli, clients.client, clients.modelset; "
            "bad = sorted(m for m in sys.modules if m.startswith(('services.gateway', 'services.worker', "
            "'services.coordinator', 'services.state', 'fastapi', 'vllm', 'ray'))); print(bad); "
            "sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_hand_written_module_is_over_the_limit():
    files = sorted(p for d in ("services", "clients", "tests", "bench", "scripts") for p in (ROOT / d).glob("**/*.py"))
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
