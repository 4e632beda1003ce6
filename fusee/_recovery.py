"""Checkpoints and recovery of one shard.

A checkpoint names a log position and holds the shard's run index (a run-store offset per
run), its unacknowledged outbox and the messages it applied. Recovery loads the newest
checkpoint, then the log records after it: runs with records there, and runs that were
active (a step in flight, a replay to finish), are loaded and replayed; parked and
finished runs stay index entries.
"""

from __future__ import annotations

from fusee import _records as R
from fusee._index import key_of
from fusee._messages import Checkpoint, IndexEntry, decode_checkpoint, encode_checkpoint
from fusee._run import RunState
from fusee._shard import Shard


def snapshot(shard: Shard) -> tuple[int, bytes]:
    """Frames for the loaded runs and the index, all as of the current position."""
    position = shard.appended
    entries = list(shard.index_entries.entries())
    for run in shard.runs.values():
        ref = _frame_of(shard, run)
        status = "active" if run.status in ("running", "stuck") else run.status
        entries.append(IndexEntry("", run.run_no, run.type, status, ref, run.next_due(), key_of(run.wid)))
    outbox = [(p.msg, p.wid, p.run) for p in shard.outbox.pending.values()]
    received = [(src, msg, failure) for (src, msg), failure in shard.outbox.received.items()]
    data = encode_checkpoint(Checkpoint(position, shard.outbox.next_msg, entries, outbox, received))
    return position, data


def _frame_of(shard: Shard, run: RunState) -> int:
    """An unchanged journal reuses the frame it already has in the run store."""
    cached = getattr(run, "frame", None)
    if cached is not None and cached[0] == len(run.journal):
        return int(cached[1])
    ref = shard.store.put_run(R.encode_frame(R.Frame(run.wid, run.run_no, run.journal)))
    run.frame = (len(run.journal), ref)  # type: ignore[attr-defined]
    return ref


async def recover(shard: Shard) -> None:
    recovered = await shard.store.recover()
    active: list[IndexEntry] = []
    if recovered.checkpoint is not None:
        checkpoint = decode_checkpoint(recovered.checkpoint)
        shard.appended = shard.durable = shard.checkpoint_position = checkpoint.position
        shard.outbox.next_msg = checkpoint.next_msg
        for msg, wid, run_no in checkpoint.outbox:
            shard.outbox._add(msg, wid, run_no)
        for src, number, failure in checkpoint.received:
            shard.outbox.received[(src, number)] = failure
        for entry in checkpoint.runs:
            if entry.status == "active":
                active.append(entry)
                continue
            shard.index_entries.put_key(entry.key, entry)
            if entry.status == "waiting_for_code":
                shard.types_without_code.add(entry.type)

    # The log after the checkpoint, grouped by workflow ID in order of first appearance.
    tails: dict[str, list[tuple[int, R.Rec]]] = {}
    position = shard.appended
    for data in recovered.records:
        position += 1
        logged = R.decode_entry(data)
        if logged.wid == "":
            shard.outbox.note("", 0, logged.rec, None)
        else:
            tails.setdefault(logged.wid, []).append((logged.run, logged.rec))
    shard.appended = shard.durable = position

    # Runs that were loaded at the checkpoint are loaded again (a step may have been in
    # flight); their IDs are in their frames.
    bases: dict[str, IndexEntry] = {}
    for entry in active:
        frame = R.decode_frame(await shard.store.get_run(entry.ref))
        entry.wid, entry.status = frame.wid, "parked"
        bases[frame.wid] = entry
        tails.setdefault(frame.wid, [])

    for wid in list(tails):
        await _recover_run(shard, wid, tails[wid], bases.get(wid))

    # Messages recovered from durable records go out again; duplicates are absorbed.
    for pending in list(shard.outbox.pending.values()):
        shard._deliver(pending.msg)
    due = shard.index_entries.next_due_ms()
    if due:
        shard._arm_for(due)


async def _recover_run(
    shard: Shard, wid: str, tail: list[tuple[int, R.Rec]], base: IndexEntry | None
) -> None:
    if base is None:
        base = shard.index_entries.pop(wid)
    run_no = base.run_no if base is not None else 0
    records: list[R.Rec] = []
    if base is not None:
        records = list(R.decode_frame(await shard.store.get_run(base.ref)).records)
    started: R.Started | None = records[0] if records and isinstance(records[0], R.Started) else None
    for number, rec in tail:
        if number != run_no:
            run_no, records = number, []
        if isinstance(rec, R.Started):
            started = rec
        records.append(rec)
        shard.outbox.note(wid, number, rec, started.parent if started else None)
    if not records:
        if base is not None:
            shard.index_entries.put(wid, base)
        return
    if isinstance(records[-1], R.Finished):
        ref = shard.store.put_run(R.encode_frame(R.Frame(wid, run_no, records)))
        shard.index_entries.put(
            wid, IndexEntry(wid, run_no, started.type if started else "?", records[-1].status, ref)
        )
        return
    run = shard.revive(wid, run_no, records)
    if run.final:
        shard.runs.pop(wid, None)
        ref = shard.store.put_run(R.encode_frame(R.Frame(wid, run_no, run.journal)))
        shard.index_entries.put(wid, IndexEntry(wid, run_no, run.type, run.status, ref))
