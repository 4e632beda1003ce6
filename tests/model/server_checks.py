"""The guarantees, checked after every step of the model test's server mode, as far as a
Client and the workers' ledger let them be seen. The in-process checks (checks.py) are
reused where they read only journals and obligations; each run's journal is the one
`Run.describe()` returns in the worker holding it (durable), carried by the test-only
`model.journal` call, since a Client's `describe` carries the summary alone.

Kept, as in process: `acknowledged` (1), `refusals` (2), `recorded` (3: a journal read
once is the start of every later read), a run's outcome has a cause in its journal, and
`progress` (4) after time passed (`check_progress`: no live timer overdue, every running
run waits on something outside it, an acknowledged cancel ends the run, a failed or
cancelled run ran the compensations it reached, a parent's close policy reached its
children).

Changed: `steps` (7) reads the workers' ledger file. A step attempt's function runs at
most once per engine (a worker process's engine between two connections), never again
once its outcome was durable (a call after the ledger position read right after the
journal showed the outcome), at least once for every outcome recorded, and a StepDone's
value is one a call of that attempt returned. Loop errors (8) become lines in the
processes' output (`tests/support/cluster.PROBLEMS`).

New: `describe`, what a Client is told agrees with the journals: `list` and `describe`
show no run the journal read after them has not reached, with the same final status, and
`result()` of an ended run is its recorded value, or raises the recorded failure's class
and message. `fencing`: a holder stopped until its leases moved never writes again; no
step result it computed after it woke is recorded (step values name their process).

Dropped (engine internals a Client cannot see): `next-due` (5) and `idle` (6) (after
every step, and between loop turns in `crash_during`), the outbox's pending messages
after a minute, the coroutines an engine left unawaited at its close (but "never
awaited" in a process's output counts), and settling before a check (the workers run on
while the checks read; every check here holds for a moving system). The deploy moves
(changed or absent code) have no server-mode counterpart yet, so neither have the
checks of runs stuck or waiting for code."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import fusee
from fusee import _codec as codec
from fusee import journal as R
from fusee._errors import Failure, error_from

from . import checks
from .harness import Violation
from .journal import FINAL, Reading, read, wakeable
from .server_cluster import StepCall
from .server_cluster import status as status_of
from .server_harness import SERVER_AVOID
from .workflows import LEDGER, TIMED_TYPE

if TYPE_CHECKING:
    from .server_harness import Journal, ServerCalls

ENDED = ("ok", "failed", "cancelled", "timed_out", "terminated")
OVERDUE_MS = 1_500  # a live timer this far past its due time has been missed
SETTLE_S = 12.0  # how long `check_progress` lets time pass and waits for the runs to settle


async def check(h: ServerCalls) -> None:
    await read_all(h)


async def _listed(client: fusee.Client) -> list[fusee.RunSummary]:
    return [row async for row in client.list()]  # an async iterator, as the engine's


async def read_all(h: ServerCalls) -> tuple[dict[str, Journal], dict[str, Reading]]:
    """Read every run, check it, and remember what was seen."""
    assert h.cluster is not None
    await h.healthy()
    problems = h.cluster.problems()
    if problems:
        raise Violation("documented-errors", f"a process reported: {problems[0]}")
    rows = await h.retried(lambda: _listed(h.client))
    listed = {row.id: row for row in rows}
    wids = set(h.o.min_run) | {wid for wid, _ in h.observed} | set(listed)
    runs: dict[str, Journal] = {}
    for wid in sorted(wids):
        described = await h.state(wid)
        got = await h.journal(wid)
        _check_views(wid, listed.get(wid), described, got)
        if got is not None:
            runs[wid] = got
    calls = h.ledger.read()  # after the journals: a call behind an outcome seen is in it
    readings = {wid: read(journal) for wid, (_, _, journal) in runs.items()}
    for wid, (run, status, journal) in runs.items():
        checks._check_recorded(h, wid, run, journal)  # type: ignore[arg-type]
        reading = readings[wid]
        if len(reading.prefixes) > 1:
            raise Violation(
                "recorded", f"run {run} of '{wid}' recorded operations of two versions of its code"
            )
        started = journal[0] if journal else None
        if isinstance(started, R.Started) and started.type == TIMED_TYPE and not started.deadline:
            raise Violation("progress", f"run {run} of '{wid}' ({TIMED_TYPE}) has no deadline")
        if reading.final and status != reading.status:
            raise Violation(
                "describe", f"run {run} of '{wid}' is {status}; its journal ends {reading.status}"
            )
        checks._check_outcome(h, wid, run, journal)  # type: ignore[arg-type]
    checks._check_acknowledged(h, runs, readings)  # type: ignore[arg-type]
    checks._check_refusals(h, runs, readings)  # type: ignore[arg-type]
    _check_steps(h, runs, calls)
    await _check_results(h, runs, readings)
    for wid, (run, _status, journal) in runs.items():
        h.observed[(wid, run)] = [R.encode_entry(R.Entry(wid, run, rec)) for rec in journal]
        checks._note_children(h, wid, run, journal)  # type: ignore[arg-type]
    return runs, readings


def _check_views(wid: str, row: Any, described: tuple[int, str] | None, got: Journal | None) -> None:
    """A listing, then a description, then the journal, read in that order: each later
    one shows the same run or a later one, and a run shown ended stays ended."""
    views = [("list", None if row is None else (row.run, status_of(row.status))), ("describe", described)]
    views.append(("journal", None if got is None else (got[0], got[1])))
    for (first, seen), (then, now) in itertools.pairwise(views):
        if seen is None:
            continue
        if now is None or now[0] < seen[0]:
            raise Violation("describe", f"'{wid}': {first} showed run {seen}, then {then} showed {now}")
        if now[0] == seen[0] and seen[1] in ENDED and now[1] != seen[1]:
            raise Violation("describe", f"'{wid}': {first} showed run {seen}, then {then} showed {now}")


def _check_steps(h: ServerCalls, runs: dict[str, Journal], calls: int) -> None:
    ledger = h.ledger
    for (key, attempt), made in ledger.calls.items():
        lifetimes = [call.lifetime for call in made]
        if len(lifetimes) != len(set(lifetimes)):
            raise Violation(
                "steps", f"step {key} attempt {attempt} ran twice in one engine: lifetimes {lifetimes}"
            )
        seen = h.first_seen.get((key, attempt))
        late = [
            call for call in made if seen is not None and call.index >= seen and not _woke_deposed(h, call)
        ]
        if late:
            raise Violation(
                "steps",
                f"step {key} attempt {attempt} ran again (in {late[0].lifetime}) after its outcome was "
                f"durable (calls {[(c.lifetime, c.index) for c in made]}, seen before call {seen})",
            )
    for wid, (run, _status, journal) in runs.items():
        attempts: dict[int, int] = {}
        for rec in journal:
            if isinstance(rec, R.Attempt):
                attempts[rec.seq] = rec.attempt
                outcome = (rec.seq, rec.attempt, None)
            elif isinstance(rec, (R.StepDone, R.StepFailed)):
                value = rec.value if isinstance(rec, R.StepDone) else None
                outcome = (rec.seq, attempts.get(rec.seq, 0) + 1, value)
            else:
                continue
            seq, attempt, value = outcome
            key = (f"{wid}/{run}/{seq}", attempt)
            made = ledger.calls.get(key)
            if not made:
                raise Violation(
                    "steps",
                    f"{type(rec).__name__} of step {key[0]} attempt {attempt} is recorded; it never ran",
                )
            if value is None:
                h.first_seen.setdefault(key, calls)
                continue
            producers = [call for call in made if codec.encode(call.value) == value]
            if not producers:
                raise Violation(
                    "steps",
                    f"step {key[0]} attempt {attempt} recorded {value!r}; its calls returned "
                    f"{[call.value for call in made]}",
                )
            woke = h.deposed.get(producers[0].lifetime)
            if woke is not None and producers[0].index >= woke:
                raise Violation(
                    "fencing",
                    f"step {key[0]} attempt {attempt} recorded {value!r}, computed by engine "
                    f"{producers[0].lifetime} after its lease moved while it was stopped",
                )
            h.first_seen.setdefault(key, calls)


def _woke_deposed(h: ServerCalls, call: StepCall) -> bool:
    """Known defect (deposed-step): a call a stopped holder made after it woke deposed."""
    woke = h.deposed.get(call.lifetime)
    return "deposed-step" in SERVER_AVOID and woke is not None and call.index >= woke


async def _check_results(h: ServerCalls, runs: dict[str, Journal], readings: dict[str, Reading]) -> None:
    """`result()` of an ended run, through the client: its recorded value, or the error
    the engine raises in process for its recorded failure (same class and message)."""
    for wid, (run, status, journal) in runs.items():
        if status not in ENDED or (wid, run) in h.verified:
            continue
        end = journal[-1]
        assert isinstance(end, R.Finished)

        async def result(wid: str = wid) -> tuple[str, Any]:
            try:
                return "ok", await h.client.run(wid).result()
            except fusee.FuseeError as error:
                if isinstance(error, (fusee.ConnectionError, fusee.NoHolderError, fusee.LeaseLostError)):
                    raise
                return "err", error

        kind, got = await h.retried(result)
        if end.status == "ok":
            want = codec.decode(end.value or b"null")
            if (kind, got) != ("ok", want):
                raise Violation(
                    "describe", f"result() of run {run} of '{wid}' gave {got!r}; recorded {want!r}"
                )
        else:
            expected = error_from(end.failure or Failure(end.status))
            if kind != "err" or type(got) is not type(expected) or str(got) != str(expected):
                raise Violation(
                    "describe",
                    f"result() of run {run} of '{wid}' ({end.status}) gave {kind} {got!r}; "
                    f"in process it raises {expected!r}",
                )
        h.verified.add((wid, run))


def _gated(h: ServerCalls, wid: str, run: int, journal: list[R.Rec]) -> bool:
    """A gated step of the run started and has no outcome recorded (it waits for the valve)."""
    ended = {rec.seq for rec in journal if isinstance(rec, (R.StepDone, R.StepFailed))}
    prefix = f"{wid}/{run}/"
    return any(
        call.kind == "gate" and int(key.rpartition("/")[2]) not in ended
        for (key, _attempt), made in h.ledger.calls.items()
        if key.startswith(prefix)
        for call in made
    )


async def check_progress(h: ServerCalls) -> None:
    """Time passes (real time: every timer a plan sets is at most a few seconds out),
    gated steps are let through, and then, within `SETTLE_S`: no live timer is overdue,
    and every run still going waits on something outside it."""
    h.log("# time passes; gated steps are let through; the runs must settle")
    deadline = time.monotonic() + SETTLE_S
    while True:
        runs, readings = await read_all(h)
        if any(_gated(h, wid, run, journal) for wid, (run, _, journal) in runs.items()):
            assert h.cluster is not None
            h.cluster.valve.open()
        now = h.t.now_ms()
        due = [
            min(r.timers.values())
            for wid, r in readings.items()
            if r.timers and not r.final and runs[wid][1] == "running"
        ]
        wait_s = (min(due, default=now) - now) / 1000 + 0.3
        if due and time.monotonic() + wait_s < deadline and min(due) > now:
            await asyncio.sleep(wait_s)
            continue
        try:
            _check_settled(h, runs, readings)
            await checks._check_children(h)  # type: ignore[arg-type]
            return
        except Violation:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def _check_settled(h: ServerCalls, runs: dict[str, Journal], readings: dict[str, Reading]) -> None:
    now = h.t.now_ms()
    LEDGER.comps.clear()
    LEDGER.comps.update(h.ledger.comps)  # (what checks._check_ended reads)
    for wid, (run, status, journal) in runs.items():
        reading = readings[wid]
        if status in ("waiting_for_code", "stuck"):
            raise Violation("progress", f"run {run} of '{wid}' is {status} though its code is registered")
        if reading.final or status in FINAL:
            checks._check_ended(h, wid, run, status, reading)  # type: ignore[arg-type]
            continue
        if reading.timers and min(reading.timers.values()) < now - OVERDUE_MS:
            seq, due = min(reading.timers.items(), key=lambda item: item[1])
            raise Violation(
                "progress",
                f"run {run} of '{wid}' has a live timer at position {seq} overdue by {now - due} ms",
            )
        gated = _gated(h, wid, run, journal)
        if (wid, run) in h.o.cancels and not gated:
            raise Violation(
                "acknowledged", f"run {run} of '{wid}' was cancelled (acknowledged) and still runs"
            )
        if not reading.timers and not wakeable(reading) and not gated:
            raise Violation(
                "progress",
                f"run {run} of '{wid}' runs but waits on nothing that can wake it (journal ends "
                f"{[type(r).__name__ for r in journal[-4:]]})",
            )
