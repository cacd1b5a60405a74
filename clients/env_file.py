"""`--env-file FILE`: KEY=VALUE lines (the cluster token among them) loaded into the environment.

Secrets come from the environment or such a file, never from a command-line value (`ps` and shell
history show those). Lines: `KEY=VALUE`, `export KEY=VALUE`, `# comments`; quotes are stripped.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

from clients.modelset import ConfigError

_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


def parse_env_file(path: str) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(path, "--env-file", f"cannot read it: {e.strerror}", "pass a readable file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, "--env-file", f"not UTF-8 text (byte {e.start}: {e.reason})",
                          "save it as UTF-8") from None
    out = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ConfigError(path, f"line {n}", "not a KEY=VALUE line",
                              "write KEY=VALUE (e.g. MSHIP_RAY_AUTH_TOKEN=...)")
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if "\0" in value:  # no environment variable can hold one
            raise ConfigError(path, f"line {n}", "a NUL character in the value", "remove it")
        out[m.group(1)] = value
    return out


def load_env_file(path: str | None) -> None:
    """Load `path` into os.environ (the file wins: it was named explicitly); warn if others can read it."""
    if not path:
        return
    values = parse_env_file(path)
    mode = Path(path).stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        print(f"mship: warning: {path} is readable by other users; it holds secrets (chmod 600 {path})",
              file=sys.stderr)
    os.environ.update(values)
