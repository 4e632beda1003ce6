"""Checkpoints: a shard's index, outbox and loaded runs' frames as of one log position,
recorded once the log up to there is durable, so recovery reads the checkpoint and the
log after it instead of the whole log. None is written when nothing changed since the
last (an invoked worker that found nothing due costs no write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from fusee._errors import FuseeError
from fusee.engine.index import RunIndex, key_of
from fusee.engine.outbox import Outbox
from fusee.engine.run import RunState
from fusee.journal import Checkpoint, IndexEntry, Msg, Status, encode_checkpoint
from fusee.storage.contract import ShardStore


class CheckpointHost(Protocol):
    """What a checkpoint reads of its shard (its position, index, outbox and loaded runs)
    and the marks it keeps there (one checkpoint at a time; the last one's position)."""

    checkpointing: bool
    checkpoint_done: asyncio.Future[None] | None
    checkpointed: tuple[int, int] | None
    checkpoint_position: int

    @property
    def closed(self) -> bool: ...
    @property
    def appended(self) -> int: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def index_entries(self) -> RunIndex: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def runs(self) -> Mapping[str, RunState]: ...
    def prune_finished(self) -> None: ...
    def put_frame(self, run: RunState) -> int: ...
    def sealed_msg(self, msg: Msg) -> Msg: ...
    def poke(self) -> None: ...
    def stopped_error(self) -> FuseeError: ...
    async def durable_at(self, lsn: int) -> None: ...


async def take(shard: CheckpointHost, *, wait: bool = False) -> None:
    """Snapshot the shard at the current position, then record it once the log up to
    there is durable. Frames are taken at the same instant, so a record is either in a
    frame or in the log after the checkpoint, never both.

    One at a time. A timed checkpoint finding one under way leaves it to finish; with
    `wait` (a clean close) it waits for it and then takes its own, so the last
    checkpoint covers the last record (else the close's second copy is skipped and
    the next open replays what the first one had already covered)."""
    while shard.checkpointing:
        if not wait or shard.checkpoint_done is None:
            return
        await asyncio.shield(shard.checkpoint_done)
    shard.prune_finished()  # before the mark: a quiet shard still lets expired runs go
    mark = (shard.appended, shard.index_entries.changes)
    if mark == shard.checkpointed:
        return
    shard.checkpointing = True
    shard.checkpoint_done = asyncio.get_running_loop().create_future()
    try:
        position, data = snapshot(shard)
        await shard.durable_at(position)
        await shard.store.checkpoint(position, data)
        shard.checkpoint_position = position
        shard.checkpointed = mark
    finally:
        shard.checkpointing = False
        shard.checkpoint_done.set_result(None)
        shard.poke()


def snapshot(shard: CheckpointHost) -> tuple[int, bytes]:
    """Frames for the loaded runs and the index, all as of the current position."""
    position = shard.appended
    entries = list(shard.index_entries.entries())
    for run in shard.runs.values():
        ref = _frame_of(shard, run)
        status = Status.ACTIVE if run.status in (Status.RUNNING, Status.STUCK) else run.status
        entries.append(IndexEntry("", run.run_no, run.type, status, ref, run.next_due(), key_of(run.wid)))
    outbox = [(shard.sealed_msg(p.msg), p.wid, p.run) for p in shard.outbox.pending.values()]
    shard.outbox.prune_received()
    received = [(src, msg, failure) for (src, msg), failure in shard.outbox.received.items()]
    data = encode_checkpoint(Checkpoint(position, shard.outbox.next_msg, entries, outbox, received))
    return position, data


def _frame_of(shard: CheckpointHost, run: RunState) -> int:
    """An unchanged journal reuses the frame it already has in the run store."""
    cached = run.frame
    if cached is not None and cached[0] == len(run.journal):
        return cached[1]
    ref = shard.put_frame(run)
    if shard.closed:
        raise shard.stopped_error()  # the store refused the frame: the shard stopped
    run.frame = (len(run.journal), ref)
    return ref
