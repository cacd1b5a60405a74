"""The committed generated code must match what proto/ generates now."""

from pathlib import Path

from scripts.gen_proto import ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path):
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in generate(tmp_path)}
    committed = {p.relative_to(ROOT): p.read_bytes() for p in sorted((ROOT / "mship").rglob("*"))
                 if p.is_file() and p.suffix in {".py", ".pyi"}}
    assert sorted(map(str, committed)) == sorted(map(str, fresh)), "generated files added or removed: run `make proto`"
    stale = [str(name) for name, data in fresh.items() if committed[name] != data]
    assert not stale, f"stale generated code, run `make proto`: {stale}"
