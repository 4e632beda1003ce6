"""The log's writes as the server's event loop drives them (docs/server.md, *The disk and
the event loop*): `Log.start_writer` returns an eventfd, `Log.request_write` asks for a
write without waiting, and after the eventfd fires `Log.durable` (which reaps a write
that completed) says what is durable. Both paths, io_uring and the writer thread, through
segment rolls (which go to the thread) and a `Log.write` on another thread meanwhile;
every acknowledged record is recovered by the next open.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import pytest
from fusee_server import _native

SHARDS = 2
SEGMENT_BYTES = 16 << 10  # small: many rolls


def wait_durable(log: _native.Log, fd: int, shard: int, target: int) -> None:
    """As the loop does: wait for the eventfd, read it, look at the log."""
    deadline = time.monotonic() + 20
    while log.durable(shard) < target:
        assert time.monotonic() < deadline, f"shard {shard} never reached {target}"
        select.select([fd], [], [], 0.5)
        try:
            os.read(fd, 8)
        except BlockingIOError:
            pass
        assert log.failure() is None


@pytest.mark.parametrize("io_uring", [True, False])
def test_the_loops_writes_are_durable_and_recovered(tmp_path: Path, io_uring: bool) -> None:
    root = tmp_path / "data"
    directory = _native.Directory(root, SHARDS, SEGMENT_BYTES)
    log = _native.Log(root / "wal", SHARDS, True, SEGMENT_BYTES, SEGMENT_BYTES)
    assert log.write_path is None
    fd = log.start_writer(io_uring)
    # io_uring where the kernel gives a ring (the thread otherwise, said on stderr).
    assert log.write_path in (("io_uring", "thread") if io_uring else ("thread",))
    written: list[list[bytes]] = [[] for _ in range(SHARDS)]
    for round in range(300):
        shard = round % SHARDS
        record = f"round {round} ".encode() * (1 + round % 13)
        last = log.stage(shard, record)
        written[shard].append(record)
        log.request_write()
        if round % 3:
            continue  # asked for while the last write may be in flight
        if round % 100 == 99:
            # A write on another thread waits for the one in flight, and then does its own.
            extra = log.stage(shard, b"from another thread")
            written[shard].append(b"from another thread")
            thread = threading.Thread(target=log.write)
            thread.start()
            thread.join(10)
            assert log.durable(shard) >= extra
        wait_durable(log, fd, shard, last)
    for shard in range(SHARDS):
        wait_durable(log, fd, shard, len(written[shard]))
    assert len(log.segment_ids()) > 1, "the segments never rolled"
    log.stop_writer()
    assert log.write_path is None
    del log
    log = _native.Log(root / "wal", SHARDS, True, SEGMENT_BYTES, SEGMENT_BYTES)
    for shard in range(SHARDS):
        assert log.take_recovered(shard, 0) == written[shard]
    directory.release()
