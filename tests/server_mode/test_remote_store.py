"""The remote store's framing, seen from what it hands to its connection: records cut
into frames under the limit, each naming where its records begin; a record over the
log's limit stops the shard instead of reaching the wire."""

from __future__ import annotations

import asyncio
from typing import Any

from fusee._errors import IoError
from fusee.protocol import messages as m
from fusee.protocol.address import parse
from fusee.storage.remote import APPEND_BYTES, RECORD_BYTES_MAX, RemoteShardStore, RemoteStorage


class Captured(RemoteStorage):
    def __init__(self) -> None:
        super().__init__(parse("127.0.0.1:1"))
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


def store(reports: list[Any]) -> tuple[Captured, RemoteShardStore]:
    storage = Captured()
    shard = RemoteShardStore(storage, 0, 5, reports.append, lambda item: None)
    shard.opened(m.Reply(0, position=10, runs_len=0))
    return storage, shard


async def test_a_flush_of_many_large_records_is_cut_into_frames_that_each_say_where_they_begin():
    storage, shard = store([])
    sizes = [3 << 20] * 7 + [1] * 5
    positions = [shard.append(bytes(size)) for size in sizes]
    assert positions == list(range(11, 11 + len(sizes)))
    shard.flush()
    appends = [s for s in storage.sent if isinstance(s, m.Append)]
    assert len(appends) > 1
    assert all(sum(map(len, a.records)) <= APPEND_BYTES for a in appends)
    expected = 11
    for append in appends:
        assert (append.shard, append.epoch, append.first) == (0, 5, expected)
        expected += len(append.records)
    assert expected == 11 + len(sizes)
    assert [len(r) for a in appends for r in a.records] == sizes


async def test_a_record_over_the_logs_limit_stops_the_shard_and_sends_nothing():
    reports: list[Any] = []
    storage, shard = store(reports)
    shard.append(b"small")
    shard.append(bytes(RECORD_BYTES_MAX + 1))
    shard.flush()
    await asyncio.sleep(0)
    assert not [s for s in storage.sent if isinstance(s, m.Append)]
    assert len(reports) == 1 and isinstance(reports[0], IoError)
