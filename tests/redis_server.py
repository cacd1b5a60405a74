"""A real Redis (Debian's redis-server) on 127.0.0.1 and a free port, owned by the test that starts it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.platform_process import free_port


class RedisServer:
    def __init__(self, workdir: Path, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server; .ci/run does)")
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
