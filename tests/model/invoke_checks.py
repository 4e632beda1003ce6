"""The guarantees in the model test's invoked mode: every check of the server mode
(server_checks.py: `acknowledged`, `refusals`, `recorded`, `steps`, `describe`,
`progress` after time passed, loop errors as lines in the processes' output), read
through the same Client, and what invoked workers add:

- `fencing`: a gated step function that returned after its invocation was answered (its
  lease gone) never produced a recorded value. (The server mode's fencing reads a stopped
  holder's engine; here an invocation's engine outlived by its own step functions.)
- `invoke-wakeups`: no shard is overdue (due more than a second ago and not invoked
  although the endpoint could take it: a lost wake-up), after every step.
- `invoke-failures`: an invocation fails, times out or is answered without taking its
  lease only in a step where a process was killed.
- `quiet` (after `settle`, once the runs settled): the server comes to a moment with
  nothing due now and nothing being invoked (timers may be scheduled later), and then no
  shard is held (the server's lease lines: every `leased to` has its `released by` or
  `let go`), no request is in flight in the handler, and the handler's process keeps no
  task and no thread of fusee's (nothing runs, and nothing is kept, while workflows
  sleep).

Changed: `documented-errors` lets a call go unanswered outside a kill only when an
invocation holding its shard left by its budget meanwhile (invoke_harness.py). Dropped
from the server mode: `fencing` of a SIGSTOPped holder (no such move here: an invoked
holder that hangs loses its lease after its budget and grace, which
tests/invoke/test_end_to_end.py covers); `healthy` no longer means every shard held
(none is, between invocations), only the server answering."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fusee import _codec as codec
from fusee import journal as R

from . import server_checks
from .harness import Violation
from .invoke_cluster import Handler

if TYPE_CHECKING:
    from .invoke_harness import InvokeCalls

QUIET_S = 40.0  # for the server to come to a moment with nothing due or invoking
FAILURES = ("failed", "timedOut", "unleased")


async def check(h: InvokeCalls) -> None:
    runs, _ = await server_checks.read_all(h)
    _check_late_steps(h, runs)
    await _check_metrics(h)
    h.open_valve_after_handbacks()


async def check_settle(h: InvokeCalls) -> None:
    await server_checks.check_progress(h)
    await check_quiet(h)


def _late(h: InvokeCalls) -> set[tuple[str, int, str]]:
    """(step key, attempt, lifetime) of gated step functions that returned after their
    invocation's request had been answered (the ledger file, in the order written)."""
    ended: set[str] = set()
    late: set[tuple[str, int, str]] = set()
    path = h.ledger.path
    if not path.exists():
        return late
    for line in path.read_text().splitlines():
        kind, *rest = line.split(" ")
        if kind == "ended":
            ended.add(rest[0])
        elif kind == "gatedone" and len(rest) == 3 and rest[2] in ended:
            late.add((rest[0], int(rest[1]), rest[2]))
    return late


def _check_late_steps(h: InvokeCalls, runs: dict[str, Any]) -> None:
    late = _late(h)
    if not late:
        return
    for wid, (run, _status, journal) in runs.items():
        attempts: dict[int, int] = {}
        for rec in journal:
            if isinstance(rec, R.Attempt):
                attempts[rec.seq] = rec.attempt
            elif isinstance(rec, R.StepDone):
                key, attempt = f"{wid}/{run}/{rec.seq}", attempts.get(rec.seq, 0) + 1
                for call in h.ledger.calls.get((key, attempt), []):
                    if (key, attempt, call.lifetime) in late and codec.encode(call.value) == rec.value:
                        raise Violation(
                            "fencing",
                            f"step {key} attempt {attempt} recorded {call.value!r}, returned by invocation "
                            f"{call.lifetime} after its request was answered",
                        )


async def _check_metrics(h: InvokeCalls) -> None:
    assert h.cluster is not None
    now = await h.retried(h.metrics)
    if now["overdue"]:
        raise Violation("invoke-wakeups", f"{now['overdue']} shards overdue (a lost wake-up): {now}")
    endpoint = now["endpoints"][0]
    server = h.cluster.server.pid
    before = h.counts.get(server)
    if before is not None and h.kills() == h.kills_checked:
        rose = {key: (before[key], endpoint[key]) for key in FAILURES if endpoint[key] > before[key]}
        if rose:
            raise Violation(
                "invoke-failures",
                f"invocations {', '.join(f'{k} {a} -> {b}' for k, (a, b) in rose.items())} with no "
                f"process killed:\n{_failure_lines(h)}",
            )
    h.counts[server] = endpoint
    h.kills_checked = h.kills()


def _failure_lines(h: InvokeCalls) -> str:
    assert h.cluster is not None
    lines = [line for line in h.cluster.server.lines if "invoke" in line and "succeeded" not in line]
    return "\n".join(lines[-30:])


def _quiet(metrics: dict[str, Any]) -> bool:
    return not (metrics["dueShards"] or metrics["invokingShards"] or metrics["endpoints"][0]["inFlight"])


async def check_quiet(h: InvokeCalls) -> None:
    """Once nothing is due now and nothing is being invoked, nobody holds a shard and the
    handler has no request in flight. Gated steps still waiting are let through (their
    shards would otherwise be invoked and handed back forever)."""
    assert h.cluster is not None
    h.quiet_checks += 1
    deadline = time.monotonic() + QUIET_S
    opened_at = 0.0
    while True:
        now = await h.retried(h.metrics)
        if _quiet(now):
            verdict = await _held_while_quiet(h, now)
            if verdict is None:
                await _check_kept(h.cluster.handler)
                h.log("# quiet: nothing due or invoking, no shard held, no request in flight")
                return
            if verdict:
                raise Violation("quiet", verdict)
        elif time.monotonic() - opened_at > 0.5:
            if not opened_at:
                h.log("# (until then the valve opens every 0.5 s: gated steps finish)")
            h.cluster.valve.open()
            opened_at = time.monotonic()
        if time.monotonic() > deadline:
            raise Violation(
                "quiet",
                f"never nothing due and nothing invoking within {QUIET_S} s: {now}\n{h.cluster.outputs()}",
            )
        await asyncio.sleep(0.05)


async def _held_while_quiet(h: InvokeCalls, quiet: dict[str, Any]) -> str | None:
    """None if no shard is held and no request in flight; "" if something was invoked
    meanwhile (a timer came due: try again); else what is held although all is quiet."""
    assert h.cluster is not None
    sent = quiet["endpoints"][0]["invocations"]
    deadline = time.monotonic() + 2.0  # (the processes' lines written before the answer arrive)
    while True:
        held, requests = h.cluster.server.held(), h.cluster.handler.in_flight()
        if not held and not requests:
            return None
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    again = await h.retried(h.metrics)
    if not _quiet(again) or again["endpoints"][0]["invocations"] != sent:
        return ""
    return (
        f"nothing due or invoking ({again}), yet shards held {held} and handler requests in flight "
        f"{requests}:\n{h.cluster.outputs()}"
    )


async def _check_kept(handler: Handler) -> None:
    left = await asyncio.to_thread(handler.left_over)
    tasks = [t for t in left["tasks"] if "/fusee/" in t["where"] or "/tests/" in t["where"]]
    threads = [name for name in left["threads"] if name.startswith("fusee")]
    if tasks or threads:
        raise Violation(
            "quiet",
            f"no invocation in flight, yet the handler's process keeps tasks {tasks} and threads {threads}",
        )
