"""Checkpoints and recovery of one shard.

A checkpoint names a log position and holds the shard's run index (a run-store offset per
run), its unacknowledged outbox and the messages it applied. Recovery loads the newest
checkpoint, then the log records after it: runs with records there, and runs that were
active (a step in flight, a replay to finish), are loaded and replayed; parked and
finished runs stay index entries.
"""

from __future__ import annotations

from fusee import journal as R
from fusee._sealing import open_msg, open_rec, opened_frame, refuse_sealed, sealed_frame
from fusee.engine.shard import Shard
from fusee.journal import IndexEntry, Status

# Read once per index entry at every open: module globals, not enum lookups (slow on 3.11).
_ACTIVE, _WAITING_FOR_CODE = Status.ACTIVE, Status.WAITING_FOR_CODE


async def recover(shard: Shard) -> None:
    """Rebuild a shard from its store: the newest checkpoint, then the log after it, read
    page by page; run frames are read in one batch."""
    latest = await shard.store.latest_checkpoint()
    active = _from_checkpoint(shard, R.decode_checkpoint(latest[1])) if latest is not None else []
    start = shard.appended
    tails, position = await _log_after(shard, start)
    shard.durability.reset(position)

    # Runs that were loaded at the checkpoint are loaded again (a step may have been in
    # flight); their IDs are in their frames. Runs parked before it and active in the log
    # after it start from their frames too: every frame is read in one batch.
    bases: dict[str, IndexEntry] = {}
    for entry, frame in zip(active, await _frames(shard, active), strict=True):
        entry.wid, entry.status = frame.wid, Status.PARKED
        bases[frame.wid] = entry
        tails.setdefault(frame.wid, [])
    for wid in tails:
        if wid not in bases and (indexed := shard.index_entries.pop(wid)) is not None:
            bases[wid] = indexed
    frames = await _frames(shard, list(bases.values()))
    in_frames = {wid: frame.records for wid, frame in zip(bases, frames, strict=True)}

    # Every record is read, and the outbox kept in step with it, before any run goes
    # live: a revived run may send at once, and must take a message number after every
    # number the log holds (one a later run's record raised the counter to), or the
    # receiver drops its message as a duplicate of that one.
    journals = [
        _journal_of(shard, wid, tails[wid], bases.get(wid), in_frames.get(wid)) for wid in list(tails)
    ]
    for wid, run_no, records, base in journals:
        _revive(shard, wid, run_no, records, base)

    if latest is not None and position == start and not active:
        # Nothing after the checkpoint and no run loaded from it (a loaded run may change
        # without a record: one whose code is missing here waits for it): the shard is
        # as the checkpoint describes it, and closing before anything changes writes none.
        shard.checkpointed = (shard.appended, shard.index_entries.changes)

    # Messages recovered from durable records go out again; duplicates are absorbed.
    for pending in list(shard.outbox.pending.values()):
        shard.messages.deliver(pending.msg)
    load = shard.index_entries.next_load_ms()
    if load:
        shard.timers.arm_for(load)  # in the past: the runs due soon load as the shard opens


def _from_checkpoint(shard: Shard, checkpoint: R.Checkpoint) -> list[IndexEntry]:
    """Take the checkpoint's position, outbox and index; the entries of the runs that were
    loaded when it was taken (to be loaded again), in its order."""
    shard.durability.reset(checkpoint.position)
    shard.checkpoint_position = checkpoint.position
    shard.outbox.next_msg = checkpoint.next_msg
    codec = shard.engine.codec
    for msg, wid, run_no in checkpoint.outbox:
        shard.outbox._add(msg if codec is None else open_msg(codec, msg), wid, run_no)
    for src, number, failure in checkpoint.received:
        shard.outbox.received[(src, number)] = failure
    active: list[IndexEntry] = []
    workflows = shard.engine.workflows
    for entry in checkpoint.runs:
        # A run that waited for its code is loaded when this engine has that code.
        if entry.status == _ACTIVE or (entry.status == _WAITING_FOR_CODE and entry.type in workflows):
            active.append(entry)
            continue
        shard.index_entries.put_key(entry.key, entry)
        if entry.status == _WAITING_FOR_CODE:
            shard.types_without_code.add(entry.type)
    return active


async def _log_after(shard: Shard, position: int) -> tuple[dict[str, list[tuple[int, R.Rec]]], int]:
    """The log after `position`, read page by page: each run's records grouped by workflow
    ID in order of first appearance (the shard's own records go to its outbox), and the
    position after the last record."""
    tails: dict[str, list[tuple[int, R.Rec]]] = {}
    codec = shard.engine.codec
    while page := await shard.store.records(position):
        for data in page:
            position += 1
            logged = R.decode_entry(data)
            if codec is not None:
                logged.rec = open_rec(codec, logged.rec)
            else:
                refuse_sealed(logged.rec, logged.wid)  # not replayed on ciphertext: said at open
            if logged.wid == "":
                shard.outbox.note("", 0, logged.rec, None)
            else:
                tails.setdefault(logged.wid, []).append((logged.run, logged.rec))
    return tails, position


async def _frames(shard: Shard, entries: list[IndexEntry]) -> list[R.Frame]:
    if not entries:
        return []
    codec = shard.engine.codec
    return [opened_frame(codec, data) for data in await shard.store.get_runs([e.ref for e in entries])]


def _journal_of(
    shard: Shard,
    wid: str,
    tail: list[tuple[int, R.Rec]],
    base: IndexEntry | None,
    in_frame: list[R.Rec] | None,
) -> tuple[str, int, list[R.Rec], IndexEntry | None]:
    """A run's journal as recovery finds it: its frame (if it had one), then its records in
    the log after the checkpoint; each record is noted in the outbox."""
    run_no = base.run_no if base is not None else 0
    records: list[R.Rec] = list(in_frame) if in_frame is not None else []
    started: R.Started | None = records[0] if records and isinstance(records[0], R.Started) else None
    for number, rec in tail:
        if number != run_no:
            run_no, records = number, []
        if isinstance(rec, R.Started):
            started = rec
        records.append(rec)
        shard.outbox.note(wid, number, rec, started.parent if started else None)
    return wid, run_no, records, base


def _revive(shard: Shard, wid: str, run_no: int, records: list[R.Rec], base: IndexEntry | None) -> None:
    if not records:
        if base is not None:
            shard.index_entries.put(wid, base)
        return
    last = records[-1]
    if isinstance(last, R.Finished):
        started = records[0]
        ref = shard.store.put_run(sealed_frame(shard.engine.codec, wid, run_no, records))
        type_ = started.type if isinstance(started, R.Started) else "?"
        expires = shard.now_ms() + shard.engine.retention_ms
        attrs = R.attributes_of(records) or None
        begun = started.now if isinstance(started, R.Started) else 0
        shard.index_entries.put(
            wid, IndexEntry(wid, run_no, type_, last.status, ref, expires, 0, attrs, begun)
        )
        return
    run = shard.revive(wid, run_no, records)
    if run.final and shard.runs.get(wid) is run:
        # Ended in its replay. (A run that continued as new there began its next run,
        # which is the ID's run now: that one stays.)
        del shard.runs[wid]
        ref = shard.store.put_run(sealed_frame(shard.engine.codec, wid, run_no, run.journal))
        expires = shard.now_ms() + shard.engine.retention_ms
        entry = IndexEntry(wid, run_no, run.type, run.status, ref, expires, 0, *run.indexed_attrs())
        shard.index_entries.put(wid, entry)
