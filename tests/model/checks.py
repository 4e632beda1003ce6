"""The guarantees, checked after every step of the model test. Each check is named by
the invariant it holds the engine to (the `Violation`'s tag):

- `acknowledged` (1): a start, signal, update, completion, cancel or terminate that
  returned is never lost, across crashes and reopenings.
- `refusals` (2): a refusal is never contradicted later (a run refused as ended stays
  ended; a run refused as existing is still there; a refused signal or update is never
  recorded).
- `recorded` (3): what a journal showed once (after a settle, so durable) is never
  rewritten: every later read of that run starts with it; a StepDone's value never
  changes.
- `progress` (4): after the clock moved far and everything settled, every run is final,
  or waits on something outside it that can wake it (a signal, a completion, a child, the
  valve); no live timer is overdue; a parent's end reached its children as its policy says;
  a failed or cancelled run ran every compensation it had reached.
- `next-due` (5): a shard's `next_due_ms()` is its earliest live timer as the journals
  tell it (a parked run's within its 100 ms bucket), 0 when none.
- `idle` (6): `shard.idle()` is True exactly when nothing can progress.
- `steps` (7): a step attempt's function runs once per engine lifetime, never again once
  its outcome was durable, and at least once for every outcome recorded.
- `documented-errors` / `no-hang` (8): checked on every call (see `Calls.call`), and
  here: nothing escaped into the event loop; a caller waiting on a run (a `result()` left
  waiting across steps) is answered once the run ended, with its outcome, and hears that
  its engine closed if it did (it then asks the reopened one).
"""

from __future__ import annotations

from typing import Any

import msgspec

import fusee
from fusee import journal as R
from fusee.engine.idle import IDLE_DUE_MS
from fusee.engine.index import BUCKET_MS, key_of
from fusee.workflow.ops import StepOp, StepState

from .harness import STOPPED, Harness, Violation
from .journal import FINAL, Reading, live_due, read, wakeable
from .known import AVOID
from .workflows import CODE_PREFIXES, LEDGER, LIMITED_TYPE, TALLY, TIMED_TYPE


def patch_order(journal: list[R.Rec]) -> str | None:
    """What breaks the promise of patches in a run's journal (docs/engine.md, *Patching*),
    or None. The run took the old branch of every patch it went past before the deploy and
    the new one from the first it reached after, so its patched steps read "s..." then
    "p...", never back; and each new-branch step follows its marker."""
    started = journal[0]
    assert isinstance(started, R.Started)
    items = msgspec.json.decode(started.input).get("items", [])
    patchable = {f"s{i}" for i, item in enumerate(items) if item == "step"}  # the others keep "s"
    markers: set[str] = set()
    new_at: str | None = None
    for rec in journal:
        if type(rec) is R.Patched:
            markers.add(rec.id)
        elif isinstance(rec, (R.StepDone, R.Attempt, R.StepFailed)):
            name = rec.name
            if name[:1] == "p":
                if name not in markers:
                    return f"step {name} took the new branch with no marker before it"
                new_at = new_at or name
            elif name in patchable and new_at is not None:
                if int(name[1:]) > int(new_at[1:]):
                    return f"step {name} took the old branch after {new_at} took the new one"
    return None


def builtin(journal: list[R.Rec]) -> bool:
    """A run of a built-in workflow (a schedule, a limit's definition, a coordinator)."""
    return bool(journal) and isinstance(journal[0], R.Started) and journal[0].type.startswith("fusee.")


async def check(h: Harness, far: bool = False) -> None:
    # Faulty storage: a shard that stopped is recovered by a restart first, and no shard
    # stops while the oracle reads (the rule itself and its settling met the faults).
    with h.calm():
        await h.quiesce()
        if await h.recover(quick=True):
            await h.quiesce()
        await _check(h, far)


async def _check_streams(h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]]) -> None:
    """A run's stream "log" holds each chunk its code appended once, in order (a replay
    appends nothing again), and a read hands over a prefix of it: durable chunks only."""
    from fusee import _codec
    from fusee.engine.stream_reads import read

    for wid, (run, status, journal) in runs.items():
        chunks = [_codec.decode(r.value) for r in journal if type(r) is R.StreamChunk and r.stream == "log"]
        if not chunks:
            continue
        if len(chunks) != len(set(chunks)) or any(
            chunks[k].endswith("b") != (k % 2 == 1) or chunks[k][:-1] != chunks[k - k % 2][:-1]
            for k in range(len(chunks))
        ):
            raise Violation("streams", f"run {run} of '{wid}': stream 'log' recorded {chunks}")
        if status == "stuck":
            continue
        batch = await read(h.t.engine.shard_of(wid), wid, "log", 0, 0.0, run)
        if batch.chunks != chunks[: len(batch.chunks)]:
            raise Violation(
                "streams", f"run {run} of '{wid}': a read gave {batch.chunks}, the journal holds {chunks}"
            )


async def _check_attributes(h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]]) -> None:
    """A run whose journal holds search attributes is found by a listing filtered on them,
    loaded, parked or finished (a stuck run's later records are not applied: skipped)."""
    for wid, (run, status, journal) in runs.items():
        merged = R.attributes_of(journal)
        if not merged or status == "stuck" or "item" not in merged:
            continue
        found = [row.id async for row in h.t.engine.list(where={"item": merged["item"], "at": merged["at"]})]
        if found != [wid]:
            raise Violation(
                "attributes", f"run {run} of '{wid}' has attributes {merged}; list(where=) found {found}"
            )


async def _check(h: Harness, far: bool) -> None:
    if h.loop_errors:
        raise Violation("documented-errors", f"an exception escaped into the event loop: {h.loop_errors[0]}")
    if LEDGER.invented:
        raise Violation(
            "heartbeats", f"s.progress() handed back progress never heartbeated: {LEDGER.invented[0]}"
        )
    t = h.t
    runs: dict[str, tuple[int, str, list[R.Rec]]] = {}
    wids = set(h.o.min_run) | {wid for wid, _ in h.observed}
    wids |= {row.id async for row in t.engine.list()}
    for wid in sorted(wids):
        got = await h.journal(wid)
        if got is not None:
            runs[wid] = got
    readings = {wid: read(journal) for wid, (_, _, journal) in runs.items()}
    for wid, (run, status, journal) in runs.items():
        _check_recorded(h, wid, run, journal)
        if readings[wid].prefixes == {"s", "p"} and not builtin(journal):
            broken = patch_order(journal)
            if broken is not None:
                raise Violation("recorded", f"run {run} of '{wid}': {broken}")
        elif len(readings[wid].prefixes) > 1 and not builtin(journal):
            raise Violation(
                "recorded",
                f"run {run} of '{wid}' recorded operations of two versions of its code "
                f"{sorted(n for n in readings[wid].step_names)}: a replay accepted a different operation",
            )
        if (
            h.code == "patched"
            and status == "stuck"
            and not readings[wid].prefixes - CODE_PREFIXES["patched"]
        ):
            # The patched code replays every journal the right code or itself recorded.
            raise Violation("progress", f"run {run} of '{wid}' is stuck under the patched code: {journal}")
        started = journal[0] if journal else None
        if isinstance(started, R.Started) and started.type == TIMED_TYPE and not started.deadline:
            raise Violation("progress", f"run {run} of '{wid}' ({TIMED_TYPE}, timeout=20 s) has no deadline")
    for wid, (run, _status, journal) in runs.items():
        _check_outcome(h, wid, run, journal)
    await _check_attributes(h, runs)
    await _check_streams(h, runs)
    _check_acknowledged(h, runs, readings)
    _check_refusals(h, runs, readings)
    _check_steps(h, runs, readings)
    _check_shards(h, runs, readings, far)
    _check_waiters(h, runs)
    for wid, (run, _status, journal) in runs.items():
        h.observed[(wid, run)] = [R.encode_entry(R.Entry(wid, run, rec)) for rec in journal]
        _note_children(h, wid, run, journal)


def _check_waiters(h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]]) -> None:
    """Every caller waiting on a run whose end is durable (the checks settled first) has
    its answer, and the answer is the run's outcome."""
    for waiter in h.waiters:
        current = runs.get(waiter.wid)
        if not waiter.task.done():
            if current is not None and current[1] in FINAL and current[1] != "continued":
                raise Violation(
                    "no-hang",
                    f"`{waiter.line}` still waits, though run {current[0]} of '{waiter.wid}' ended "
                    f"{current[1]}",
                )
            continue
        if waiter.checked:
            continue
        waiter.checked = True
        kind, value = waiter.task.result()
        if kind == "err":
            _check_waiter_error(h, waiter, value)
        elif current is not None and current[0] == waiter.run and current[1] == "ok":
            end = current[2][-1]
            assert isinstance(end, R.Finished)
            if value != fusee._codec.decode(end.value or b"null"):
                raise Violation(
                    "no-hang",
                    f"`{waiter.line}` answered {value!r}; run {current[0]} ended with {end.value!r}",
                )


def _check_waiter_error(h: Harness, waiter: Any, error: BaseException) -> None:
    if isinstance(error, fusee.ClosedError) and waiter.epoch == LEDGER.epoch:
        raise Violation("documented-errors", f"`{waiter.line}` heard its engine closed; it is open: {error}")
    if isinstance(error, fusee.NotFoundError) and waiter.run is not None:
        raise Violation("refusals", f"`{waiter.line}` was refused NotFound; run {waiter.run} existed")
    if isinstance(error, STOPPED) and h.faulty is None:
        raise Violation("documented-errors", f"`{waiter.line}` raised {type(error).__name__}: {error}")


def _check_outcome(h: Harness, wid: str, run: int, journal: list[R.Rec]) -> None:
    """A run ends failed, cancelled or timed out only for a reason its journal shows."""
    end = journal[-1] if journal else None
    if not isinstance(end, R.Finished):
        return
    why = end.failure.message if end.failure else ""
    if end.status == "failed":
        causes = [
            r
            for r in journal
            if isinstance(r, R.StepFailed)
            or (isinstance(r, (R.ChildStarted, R.ChildResult, R.Completed)) and r.failure is not None)
        ]
        if not causes:
            raise Violation("progress", f"run {run} of '{wid}' failed with no failure recorded before: {why}")
    elif end.status == "cancelled" and not any(isinstance(r, R.CancelRequested) for r in journal):
        raise Violation("progress", f"run {run} of '{wid}' ended cancelled, never asked to: {why}")
    elif end.status == "timed_out":
        started = journal[0]
        if not isinstance(started, R.Started) or not started.deadline or started.deadline > h.t.now_ms():
            raise Violation("progress", f"run {run} of '{wid}' timed out before any deadline: {why}")


def _note_children(h: Harness, wid: str, run: int, journal: list[R.Rec]) -> None:
    started = {r.seq for r in journal if isinstance(r, R.ChildStarted) and r.failure is None}
    h.parents[(wid, run)] = [
        (r.id, r.close) for r in journal if isinstance(r, R.ChildRequested) and r.seq in started
    ]


def _check_recorded(h: Harness, wid: str, run: int, journal: list[R.Rec]) -> None:
    seen = h.observed.get((wid, run))
    if seen is None:
        return
    now = [R.encode_entry(R.Entry(wid, run, rec)) for rec in journal]
    for index, old in enumerate(seen):
        if index >= len(now):
            raise Violation(
                "recorded",
                f"run {run} of '{wid}' lost records: {len(seen)} were seen, now {len(now)} "
                f"(first lost: {R.decode_entry(old).rec!r})",
            )
        if now[index] != old:
            before, after = R.decode_entry(old).rec, R.decode_entry(now[index]).rec
            kind = "a StepDone's value changed" if isinstance(before, R.StepDone) else "a record changed"
            raise Violation(
                "recorded", f"run {run} of '{wid}', record {index}: {kind}: was {before!r}, now {after!r}"
            )


def _check_acknowledged(
    h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]], readings: dict[str, Reading]
) -> None:
    o = h.o
    for wid, least in o.min_run.items():
        if wid not in runs:
            raise Violation("acknowledged", f"'{wid}' was started (run {least}) and is gone")
        if runs[wid][0] < least:
            raise Violation(
                "acknowledged", f"'{wid}' was started as run {least}; the engine has run {runs[wid][0]}"
            )
    for wid, run, payload in o.signals:
        if wid in runs and runs[wid][0] == run and payload not in readings[wid].signals:
            raise Violation(
                "acknowledged", f"an acknowledged signal {payload!r} to run {run} of '{wid}' is lost"
            )
    for uid, (wid, run, outcome) in o.updates.items():
        if wid in runs and runs[wid][0] == run and uid not in readings[wid].updates_done:
            raise Violation(
                "acknowledged", f"acknowledged update {uid} ({outcome}) of run {run} of '{wid}' is lost"
            )
    for wid, run in o.cancels:
        if (
            wid in runs
            and runs[wid][0] == run
            and not readings[wid].cancel_requests
            and not readings[wid].final
        ):
            raise Violation("acknowledged", f"an acknowledged cancel of run {run} of '{wid}' is lost")
    for wid, run in o.terminates:
        if wid in runs and runs[wid][0] == run and readings[wid].status != "terminated":
            raise Violation(
                "acknowledged", f"run {run} of '{wid}' was terminated; it is now {readings[wid].status}"
            )
    for wid, run, seq in o.completions:
        if wid in runs and runs[wid][0] == run and seq not in readings[wid].completed:
            raise Violation("acknowledged", f"an acknowledged completion of '{wid}' position {seq} is lost")


def _check_refusals(
    h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]], readings: dict[str, Reading]
) -> None:
    o = h.o
    for wid, run, what in o.ended:
        if wid in runs and runs[wid][0] == run and not readings[wid].final:
            raise Violation(
                "refusals",
                f"{what} was refused as ended (run {run}), but run {run} is {runs[wid][1]} now",
            )
        if wid not in runs or runs[wid][0] < run:
            raise Violation(
                "refusals",
                f"{what} was refused as ended (run {run}); the engine now has {runs.get(wid, (None,))[0]}",
            )
    for wid, run in o.existed:
        if wid not in runs or runs[wid][0] < run:
            raise Violation(
                "refusals", f"a start of '{wid}' was refused as existing (run {run}); now: {runs.get(wid)}"
            )
    for wid, payload in o.bad_signals:
        if wid in readings and payload in readings[wid].signals:
            raise Violation(
                "refusals", f"a signal to '{wid}' refused for its type ({payload!r}) was recorded"
            )
    for wid, run, uid in o.refused_updates:
        if (
            wid in runs
            and runs[wid][0] == run
            and uid in readings[wid].updates_accepted
            and uid not in o.updates
        ):
            raise Violation("refusals", f"refused update {uid} of '{wid}' was recorded as accepted")


def _check_steps(
    h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]], readings: dict[str, Reading]
) -> None:
    for (key, attempt), epochs in LEDGER.calls.items():
        if len(epochs) != len(set(epochs)):
            raise Violation("steps", f"step {key} attempt {attempt} ran twice in one engine: epochs {epochs}")
        seen = h.first_seen.get((key, attempt))
        if seen is not None and any(epoch > seen for epoch in epochs):
            raise Violation(
                "steps",
                f"step {key} attempt {attempt} ran again (epochs {epochs}) after its outcome was durable "
                f"(seen in epoch {seen})",
            )
    for wid, (run, _status, journal) in runs.items():
        if builtin(journal):
            continue  # a schedule's steps: not the model's functions, not in the ledger
        for seq, attempt, kind in readings[wid].outcomes:
            key = (f"{wid}/{run}/{seq}", attempt)
            if key not in LEDGER.calls:
                raise Violation(
                    "steps", f"{kind} of step {key[0]} attempt {attempt} is recorded; it never ran"
                )
            h.first_seen.setdefault(key, LEDGER.epoch)


def expected_due(h: Harness, wid: str, reading: Reading, status: str) -> tuple[int, bool]:
    """A run's earliest live timer and whether the engine holds it parked."""
    if status != "running" or reading.final:
        return 0, False
    parked = wid not in h.t.engine.shard_of(wid).runs
    return live_due(reading), parked


def _check_shards(
    h: Harness, runs: dict[str, tuple[int, str, list[R.Rec]]], readings: dict[str, Reading], far: bool
) -> None:
    t = h.t
    now = t.now_ms()
    for shard in t.engine.shards:
        if shard.outbox.pending:
            if far:
                raise Violation(
                    "progress",
                    f"shard {shard.index}: messages unacknowledged after a minute of resends: "
                    f"{[p.msg.kind + '->' + p.msg.target for p in shard.outbox.pending.values()]}",
                )
            continue  # a message on its way: its resend is the shard's next due
        dues = []
        maybe: set[int] = set()
        mine = [wid for wid in runs if t.engine.shard_index(wid) == shard.index]
        if "wait-hole" in AVOID and any(readings[wid].ambiguous for wid in mine):
            continue  # known: a journal with a hole at a wait's position tells no timers
        for wid, (_run, status, _journal) in runs.items():
            if t.engine.shard_index(wid) != shard.index:
                continue
            due, parked = expected_due(h, wid, readings[wid], status)
            if due:
                dues.append((due // BUCKET_MS * BUCKET_MS if parked else due, due, wid, parked))
            elif status == "waiting_for_code" and readings[wid].deadline and not readings[wid].final:
                # Its deadline may be kept without the code (then it must end the run).
                deadline = readings[wid].deadline
                maybe.update({deadline, deadline // BUCKET_MS * BUCKET_MS})
        want = min(dues, default=None)
        got = shard.next_due_ms()
        if "stale-due" in AVOID and got and got in _stale_buckets(shard, dues):
            continue  # known: an ended run's bucket stays; the shard's due says nothing then
        if got and got <= now:
            raise Violation(
                "progress", f"shard {shard.index}: next_due_ms() is {now - got} ms in the past after a settle"
            )
        if got in maybe and (want is None or got <= want[0]):
            want = (got, got, "a run waiting for code (its deadline)", False)
        if want is None:
            if got:
                raise Violation(
                    "next-due",
                    f"shard {shard.index}: next_due_ms() is {got} (now+{got - now} ms) but no run has a live timer",
                )
        elif got != want[0] and not (want[3] and want[0] <= got <= want[1]):
            raise Violation(
                "next-due",
                f"shard {shard.index}: next_due_ms() is {got or 0} ({'now+' + str(got - now) if got else 'none'}); "
                f"the earliest live timer is '{want[2]}' at now+{want[1] - now} ms{' (parked)' if want[3] else ''}",
            )
        # A checkpoint being written is progress too (spec: Idle): local mode writes it on
        # a thread, which may still be at it when the model looks.
        busy = (
            h.gates_open(shard.index)
            or h.permits_waiting(shard.index)
            or shard.checkpointing
            or (want is not None and want[0] - now < IDLE_DUE_MS)
        )
        if shard.idle() == busy:
            raise Violation(
                "idle",
                f"shard {shard.index}: idle() is {shard.idle()}, but "
                + (
                    "a gated step runs"
                    if h.gates_open(shard.index)
                    else "a step waits for a permit"
                    if h.permits_waiting(shard.index)
                    else "a checkpoint is being written"
                    if shard.checkpointing
                    else f"the next timer is due in {want[0] - now} ms"
                    if want is not None
                    else "nothing can progress"
                ),
            )


def _stale_buckets(shard: Any, dues: list[tuple[int, int, str, bool]]) -> set[int]:
    """Bucket starts that hold no parked run due then (left by runs loaded since)."""
    live = {key_of(wid): floored for floored, _due, wid, parked in dues if parked}
    out = set()
    for bucket, keys in shard.index_entries._buckets.items():
        if not any(live.get(key) == bucket * BUCKET_MS for key in keys):
            out.add(bucket * BUCKET_MS)
    return out


async def check_progress(h: Harness) -> None:
    """After the clock moved far past every timer: nothing waits on a timer, and a run
    still going waits on something outside it."""
    await check(h, far=True)
    now = h.t.now_ms()
    for wid in sorted({row.id async for row in h.t.engine.list()}):
        got = await h.journal(wid)
        if got is None:
            continue
        run, status, journal = got
        reading = read(journal)
        type_ = journal[0].type if journal and isinstance(journal[0], R.Started) else "?"
        code = h.code_for(type_)
        if status == "waiting_for_code" and code == "absent":
            continue
        if status == "stuck" and reading.prefixes - CODE_PREFIXES[code]:
            continue  # it recorded operations the code now has no more
        if status in ("waiting_for_code", "stuck"):
            raise Violation("progress", f"run {run} of '{wid}' is {status} though its code is {code}")
        if reading.final or status in FINAL:
            _check_ended(h, wid, run, status, reading)
            continue
        if reading.ambiguous and "wait-hole" in AVOID:
            continue
        if reading.timers and min(reading.timers.values()) <= now:
            seq, due = min(reading.timers.items(), key=lambda item: item[1])
            raise Violation(
                "progress",
                f"run {run} of '{wid}' ({status}) has a live timer at position {seq} overdue by {now - due} ms",
            )
        if (wid, run) in h.o.cancels and not _gated_now(h, wid):
            raise Violation(
                "acknowledged", f"run {run} of '{wid}' was cancelled (acknowledged) and still runs"
            )
        await _check_child_results(h, wid, run, reading)
        if type_ == LIMITED_TYPE and not h.limit_defined:
            continue  # its steps wait for a limit nobody defined
        if type_ == TALLY.name:
            continue  # an object's key waits for calls, and never ends (object_moves.py)
        # (a live timer not yet due: a plan's never is, a minute on; a coordinator keeps
        # one for the event IDs it remembers)
        if not wakeable(reading) and not reading.timers and not _gated_now(h, wid):
            raise Violation(
                "progress",
                f"run {run} of '{wid}' runs but waits on nothing that can wake it (journal ends "
                f"{[type(r).__name__ for r in journal[-4:]]})",
            )
    await _check_children(h)


async def _check_child_results(h: Harness, wid: str, run: int, reading: Reading) -> None:
    """A parent waiting on a child that ended has its result: every message was answered
    by now (a minute of resends), so the child's outcome reached its parent."""
    for child in reading.children.values():
        got = await h.journal(child)
        if got is None or got[1] not in FINAL or got[1] == "continued":
            continue
        started = got[2][0] if got[2] else None
        parent = started.parent if isinstance(started, R.Started) else None
        if parent is not None and (parent.wid, parent.run) == (wid, run):
            raise Violation(
                "progress",
                f"run {run} of '{wid}' has no result of its child '{child}', which ended {got[1]}",
            )


def _gated_now(h: Harness, wid: str) -> bool:
    run = h.t.engine.shard_of(wid).runs.get(wid)
    return run is not None and any(
        isinstance(op, StepOp)
        and op.state is StepState.RUNNING
        and not op.done
        and op.fn.__qualname__.startswith("_gated")
        for op in run.ops.values()
    )


def _check_ended(h: Harness, wid: str, run: int, status: str, reading: Reading) -> None:
    if status not in ("failed", "cancelled"):
        return
    reached = LEDGER.comps.get((wid, run))
    if not reached:
        return
    missing = [name for name in reached if name not in reading.step_names]
    if missing:
        raise Violation(
            "progress", f"run {run} of '{wid}' ended {status} without running its compensations {missing}"
        )


async def _check_children(h: Harness) -> None:
    """A parent that ended (or was replaced) applied its close policy to its children."""
    for (wid, run), children in h.parents.items():
        current = await h.journal(wid)
        if current is None:
            continue
        if current[0] != run or current[1] not in FINAL or current[1] == "continued":
            continue  # a run replaced or continued as new: how it ended is not in view
        if "close-without-code" in AVOID and h.absent_once and current[2][0].type == TIMED_TYPE:  # type: ignore[attr-defined]
            continue  # known: a run ended while its code was absent closes no children
        for child, close in children:
            if close == "abandon":
                continue
            got = await h.journal(child)
            if got is None:
                continue
            reading = read(got[2])
            if close == "terminate" and not reading.final:
                raise Violation(
                    "progress", f"run {run} of '{wid}' ended; its child '{child}' (terminate) still runs"
                )
            if close == "request-cancel" and not reading.final and not reading.cancel_requests:
                raise Violation(
                    "progress",
                    f"run {run} of '{wid}' ended; its child '{child}' (request-cancel) was never asked",
                )
