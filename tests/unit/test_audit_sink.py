"""The audit trail's writer (services/gateway/edge/audit.py `AuditSink`): records go to the file from
a thread of their own, so a stalled or failing disk never holds the gateway's event loop; none is
lost while the log can be written again, and what waits is bounded."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.gateway.edge.audit import AuditSink
from tests.helpers import until_sync

DROPPED = "mship_gateway_audit_records_dropped_total"


def dropped() -> float:
    return REGISTRY.get_sample_value(DROPPED) or 0.0


class Fifo:
    """A named pipe as the audit log: its writer blocks in open() until a reader comes, as on a
    stalled disk. `drain()` opens it (read and write: later opens never block, reads never end) and
    collects the lines that arrive."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path, self.fd, self.data = path, -1, b""

    def drain(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    def lines(self) -> list[dict]:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                self.data += chunk
        except BlockingIOError:
            pass
        return [json.loads(line) for line in self.data.decode().splitlines()]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Fifo]:
    pipe = Fifo(tmp_path / "audit.jsonl")
    try:
        yield pipe
    finally:
        if pipe.fd < 0:  # a writer thread still blocked in open() gets its reader and ends
            pipe.drain()
        pipe.close()


def test_a_stalled_log_never_holds_the_writer_and_loses_nothing(fifo: Fifo) -> None:
    sink = AuditSink(str(fifo.path))
    try:
        for n in range(1000):
            sink.write({"n": n})  # returns at once, while the writer thread waits for the "disk"
        fifo.drain()
        until_sync(lambda: len(fifo.lines()) == 1000, "every record written once the log takes writes again",
                   timeout_s=10, poll_s=0.01)
        assert [r["n"] for r in fifo.lines()] == list(range(1000))
    finally:
        sink.close()


def test_past_max_waiting_records_are_dropped_and_counted(fifo: Fifo) -> None:
    sink = AuditSink(str(fifo.path))
    sink.MAX_WAITING = 10
    before = dropped()
    try:
        for n in range(25):
            sink.write({"n": n})
        assert dropped() - before == 15  # the waiting ones stay queued until written: memory is bounded
        fifo.drain()
        until_sync(lambda: len(fifo.lines()) == 10, "the ten that waited written", timeout_s=10, poll_s=0.01)
        assert [r["n"] for r in fifo.lines()] == list(range(10))
    finally:
        sink.close()


def test_a_log_that_fails_is_tried_again_with_its_records_kept(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "not-yet" / "audit.jsonl"  # its directory is missing: every write fails
    sink = AuditSink(str(log))
    sink.RETRY_S = 0.02
    try:
        with caplog.at_level(logging.WARNING, "services.gateway.edge.audit"):
            for n in range(3):
                sink.write({"n": n})
            until_sync(lambda: "cannot write the audit log" in caplog.text, "the failure logged", poll_s=0.01)
            log.parent.mkdir()
            until_sync(log.exists, "written once it can be", timeout_s=10, poll_s=0.01)
            sink.close()
        assert [json.loads(line)["n"] for line in log.read_text().splitlines()] == [0, 1, 2]
        assert caplog.text.count("cannot write the audit log") == 1  # once per outage, not per retry
        assert "is written again" in caplog.text
        assert oct(log.stat().st_mode & 0o777) == oct(0o640 & ~current_umask())
    finally:
        sink.close()


def test_a_write_that_fails_part_way_resumes_where_it_stopped(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills in the middle of a batch: the retry writes the rest, not the batch again
    (which would leave a torn line and the batch's first records twice)."""
    log = tmp_path / "audit.jsonl"
    real_write, calls = os.write, []

    def filling_disk(fd: int, data: bytes | memoryview) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(log):
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:len(data) // 2 + 3]))  # part of a line
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    sink = AuditSink(str(log))
    sink.RETRY_S = 0.02
    monkeypatch.setattr(os, "write", filling_disk)
    try:
        sink.write({"n": 0, "text": "x" * 1000})
        sink.write({"n": 1, "text": "y" * 1000})
        until_sync(lambda: len(calls) >= 3, "written again after the failure", timeout_s=10, poll_s=0.01)
    finally:
        sink.close()  # (what still waits is written before the file is read)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["n"] for r in records] == [0, 1]
    assert calls[2] == calls[0] - (calls[0] // 2 + 3)  # the retry wrote only what was left


def current_umask() -> int:
    status = Path("/proc/self/status").read_text()  # (os.umask would change it for every thread meanwhile)
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)


def test_close_writes_what_waits_and_counts_what_it_cannot(tmp_path: Path) -> None:
    good = AuditSink(str(tmp_path / "audit.jsonl"))
    for n in range(100):
        good.write({"n": n})
    good.close()
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 100  # no polling: close() wrote them
    bad = AuditSink(str(tmp_path / "missing" / "audit.jsonl"))
    bad.RETRY_S = 0.02
    before = dropped()
    bad.write({"n": 1})
    bad.write({"n": 2})
    bad.close()  # stopping while the log still fails: lost, and counted
    assert dropped() - before == 2
