"""The native disk path read again and again by a long-lived process (`fusee server`
keeps one Log and one Shard per shard open and recovers a shard from disk at every
lease): `Log.read_records` reads a shard's durable records back from the segment files
from any position, any number of times, in bounded pages, while a thread writes; a read
below the retired segments refuses; run-store reads and appends go on during a
checkpoint's fsyncs; `Shard.latest_checkpoint` returns the newest checkpoint each time.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from fusee_server import _native

SHARDS = 2
SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX = 16 << 10, 32 << 10  # small: many rolls
PAGE_BYTES = 1 << 20


def open_log(tmp_path: Path) -> tuple[_native.Directory, _native.Log]:
    root = tmp_path / "data"
    directory = _native.Directory(root, SHARDS, SEGMENT_BYTES_MIN)
    log = _native.Log(root / "wal", SHARDS, True, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)
    return directory, log


def record(shard: int, position: int) -> bytes:
    """The record at `position` of `shard`: its bytes say where it belongs."""
    return f"s{shard}-p{position}-".encode() + b"x" * (position % 97)


def expected(shard: int, first: int, last: int) -> list[bytes]:
    return [record(shard, position) for position in range(first, last + 1)]


def write_rounds(log: _native.Log, rounds: int, per: int) -> None:
    """`rounds` batches, each with `per` records of every shard."""
    for _ in range(rounds):
        for shard in range(SHARDS):
            first = log.appended(shard) + 1
            log.stage_many(shard, [record(shard, first + i) for i in range(per)])
        log.write()


def read_all(log: _native.Log, shard: int, after: int, max_bytes: int) -> list[bytes]:
    records: list[bytes] = []
    while page := log.read_records(shard, after + len(records), max_bytes):
        records.extend(page)
    return records


def test_records_read_after_any_position_any_number_of_times_are_the_ones_written(tmp_path: Path) -> None:
    directory, log = open_log(tmp_path)
    write_rounds(log, 40, 7)
    last = log.durable(1)
    assert last == 280 and len(log.segment_ids()) >= 3
    for after in (0, 1, 6, 7, 100, 279):
        for _ in range(2):
            assert log.read_records(1, after, PAGE_BYTES) == expected(1, after + 1, last)
    assert log.read_records(1, last, PAGE_BYTES) == []
    assert log.read_records(1, last + 3, PAGE_BYTES) == []
    assert read_all(log, 0, 9, 500) == expected(0, 10, last)
    with pytest.raises(ValueError, match="shard 2"):
        log.read_records(SHARDS, 0, PAGE_BYTES)
    directory.release()


def test_a_page_is_bounded_and_holds_one_record_at_least(tmp_path: Path) -> None:
    directory, log = open_log(tmp_path)
    log.stage_many(0, [b"a" * 100] * 10 + [b"b" * 5000])
    log.write()
    assert log.read_records(0, 0, 250) == [b"a" * 100] * 2
    assert log.read_records(0, 0, 0) == [b"a" * 100]
    assert log.read_records(0, 10, 10) == [b"b" * 5000], "one record, though longer than the page"
    assert log.read_records(0, 5, 1000) == [b"a" * 100] * 5
    directory.release()


def test_a_read_below_the_retired_segments_raises_value_error(tmp_path: Path) -> None:
    directory, log = open_log(tmp_path)
    write_rounds(log, 40, 10)
    last = log.durable(0)
    assert log.retire([last - 50] * SHARDS)
    with pytest.raises(
        ValueError, match=r"shard 0: records after position 3 .* from position \d+"
    ) as refused:
        log.read_records(0, 3, PAGE_BYTES)
    found = re.search(r"from position (\d+)", str(refused.value))
    assert found is not None
    first = int(found.group(1))
    assert 4 < first <= last - 50
    assert log.read_records(0, first - 1, PAGE_BYTES) == expected(0, first, last)
    directory.release()


def test_reads_while_a_thread_writes_return_only_durable_records(tmp_path: Path) -> None:
    directory, log = open_log(tmp_path)
    writer = threading.Thread(target=write_rounds, args=(log, 300, 3))
    writer.start()
    reads = 0
    while writer.is_alive() or reads == 0:
        before = log.durable(1)
        records = log.read_records(1, 0, 1 << 30)
        after = log.durable(1)
        assert before <= len(records) <= after
        assert records == expected(1, 1, len(records))
        reads += 1
    writer.join()
    assert log.read_records(1, 0, 1 << 30) == expected(1, 1, 900)
    directory.release()


def test_read_run_and_append_run_go_on_while_a_checkpoint_is_written(tmp_path: Path) -> None:
    """The checkpoint writes its file under a temporary name, flushes it, then renames
    it: a read and an append that start while that name exists and end before it is
    gone did not wait for the checkpoint. Locking the run store for the whole checkpoint
    would make every such read end after the rename."""
    directory, log = open_log(tmp_path)
    shard = _native.Shard(tmp_path / "data", 0, log)
    first = shard.append_run(0, b"parked run")
    during = 0
    for position in range(1, 6):  # a machine too fast to see the temporary file tries again
        temporary = tmp_path / "data" / "shard-000" / f"checkpoint-{position:016x}.tmp"
        checkpoint = threading.Thread(target=shard.checkpoint, args=(position, bytes(32 << 20)))
        checkpoint.start()
        while checkpoint.is_alive():
            if not temporary.exists():
                continue
            offset = shard.append_run(shard.runs_len, b"appended during the checkpoint")
            assert shard.read_run(first) == b"parked run"
            assert shard.read_run(offset) == b"appended during the checkpoint"
            if temporary.exists():
                during += 1
        checkpoint.join()
        if during:
            break
    assert during > 0, "no run-store read or append finished while the checkpoint was written"
    latest = shard.latest_checkpoint()
    assert latest is not None and latest[0] == position and len(latest[1]) == 32 << 20
    directory.release()


def test_latest_checkpoint_returns_the_newest_each_time(tmp_path: Path) -> None:
    directory, log = open_log(tmp_path)
    shard = _native.Shard(tmp_path / "data", 1, log)
    assert shard.latest_checkpoint() is None
    log.stage_many(1, expected(1, 1, 4))
    log.write()
    shard.append_run(0, b"frame")
    shard.checkpoint(3, b"three")
    assert shard.latest_checkpoint() == (3, b"three")
    assert shard.latest_checkpoint() == (3, b"three")
    shard.checkpoint(4, b"four")
    assert shard.latest_checkpoint() == (4, b"four")
    # Opened again (the log too: a shard's checkpoint is checked against the log as
    # recovered at the log's open).
    del shard, log
    directory.release()
    directory, log = open_log(tmp_path)
    again = _native.Shard(tmp_path / "data", 1, log)
    assert again.latest_checkpoint() == (4, b"four"), "the one chosen at open"
    assert again.recovered_checkpoint() == (4, b"four")
    assert again.recovered_checkpoint() is None, "taken once"
    assert again.latest_checkpoint() == (4, b"four"), "read any number of times"
    assert again.read_run(0) == b"frame"
    directory.release()
