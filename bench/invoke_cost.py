"""Invoked workers' cost: the reference table for invoked workers (README, *Speed*),
row by row, against its goals. Run on demand:
`python bench/invoke_cost.py [COLD [FAN [SLEEPS [PARKED]]]] [--quick] [--dir PARENT]
[--profile DIR] [--loop asyncio|uvloop] [--only sleeps|parked] [--sleepers 1,10,100]` (defaults
`100 200 100 10000`, as the reference run; a few minutes on two cores; `--quick` is a smoke
run of well under a minute). `--only sleeps` runs row 5 alone, once per count of
`--sleepers` (default SLEEPS), and prints each one's lateness; `--only parked` runs row 6
alone (PARKED runs, COLD / 5 starts). Not a timed test.

The setup, all on loopback on this machine, each part a process of its own as deployed:
- `python -m fusee server --shards 4 --invoke http://127.0.0.1:H/ --invoke-secret-file F`,
  its data directory in a fresh directory under `--dir` (default: the system's temporary
  directory), removed afterwards;
- the handler: uvicorn serving `handlers.from_environment()` (what `handlers.asgi:app`
  is), FUSEE_INVOKE_TRACE=1, with a wrapper that prints each request's arrival and answer
  times once it has answered (see _invoke_procs.py). A fresh engine per invocation, as
  always. The process is started once and kept (a platform's process and runtime cold
  start is not measured: it comes on top, see bench/handler_boot.py);
- the client: this process (`fusee.Client`).
The reference run (a Rust implementation) has all three in one process; in Python they would share one GIL
and one event loop, which is not how the handler is deployed. One handler process
serves every invocation, so the invocations of rows 3 to 5, on four shards at once,
share its one event loop (on a functions platform each would get an instance).

Rows (COLD, FAN, SLEEPS, PARKED are the four arguments):
1. a start for a shard nobody holds, from just before `client.start` to the first step's
   body (the step returns time.time()): p50/p90/max over COLD starts, each from a state
   where the server's metrics show nothing invoking and nothing due, and 20 ms after it
   (the processes idle, as before a real cold start);
2. of which until the engine is open (the handler's trace: `opened`, placed on the same
   clock through the request's arrival time), and the shard's own recovery (the trace's
   `open_ms`, what the engine measured);
3. FAN workflows of 4 trivial steps on 4 shards started at once: invocations (the
   metrics' `sent`, before and after) and steps per invocation;
4. the same started one after another;
5. SLEEPS runs started at once, each sleeping 1 s and then running a step: how late that
   step ran after the timer's recorded due time (p50), the handler's time (request
   arrival to answer) summed over every invocation of the row per run, and the engine's
   open (Engine.open: from leased to opened in the trace) per invocation. The server
   invokes at the start of the 100 ms bucket of the shard's earliest timer (the run
   index's granularity), so how long before the timer the engine is open varies from
   run to run; the line under the table says how long it was. Then the same runs on a
   long-lived worker, and in local mode in this process (no server);
6. PARKED runs asleep for an hour on one shard (IDs chosen by zlib.crc32(id) % 4), their
   invocation over: then starts on that shard as in row 1 (COLD / 5 of them, at least 5),
   p50, and of which the shard's recovery. The parked runs are counted afterwards (a
   listing), so a wrong shard or a lost run fails the benchmark.
Under the table: where a cold start's time goes (p50 of each part, from the handler's
trace: its TCP connect, OPEN to WELCOME, Engine.open, the first APPEND sent and made
durable), and this machine's floor, measured first in the same run (bench/_floors.py: a
raw TCP round trip to an idle process, disk-check's flush, asyncio.sleep's oversleep); each
figure says how many times its floor it is (cold starts: 4 RTT + 1 flush; the step after
a sleep: oversleep + 1 RTT + 1 flush).

`--profile DIR`: the server and the handler run under cProfile, their stats written to
DIR (server.prof, handler.prof) when they stop; the times are then cProfile's, not the
product's.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _floors import Floors, times
from _floors import measure as measure_floors
from _invoke_procs import Served, handler_args, served, server_args, worker_args
from _server_procs import Child, run_in

import fusee
from tests.support.cluster import Cluster as Processes  # (the repository on sys.path: _server_procs)
from tests.support.cluster import quiet

SHARDS = 4
FAN_STEPS = 4
SLEEP_MS = 1000
WARM_UP_STARTS = 3  # the handler process's first invocations import what they use
PARKED_CONCURRENCY = 256  # starts in flight while parking runs
QUIET_TIMEOUT_S = 120.0
SETTLE_S = 0.02  # after the last invocation's answer, before a cold start: its process's tail

GOAL_COLD_FLOORS = 2.5  # the cold start's p50 against its floor (bench/_floors.py)
GOAL_FAN_INVOCATIONS = 4
GOAL_LATE_P50_MS = 1.0
GOAL_TIME_PER_RUN_MS = 15.0
GOAL_PARKED_P50_MS = 100.0


def pct(values: list[float], p: float) -> float:
    """The p-th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def goal(met: bool, text: str) -> str:
    return f"(goal {text}: {'met' if met else 'MISSED'})"


# -- the processes and the client --------------------------------------------------------


class Cluster(Processes[Child]):
    """The processes (tests/support/cluster.py; here the benchmark's children) and the
    client the figures are taken through."""

    client: fusee.Client

    async def quiet(self, due_allowed: int = 0) -> dict[str, Any]:
        """The metrics once nothing is being invoked and nothing is due. `due_allowed`:
        shards whose next due time is far off (the metrics count those as due too)."""
        return await quiet(self.client, due_allowed, every=0.005, timeout=QUIET_TIMEOUT_S)

    async def handled(self, mark: int, count: int) -> list[Served]:
        """The invocations the handler answered since its output line `mark`, once there
        are `count` (its stamp line comes just after its answer)."""
        assert self.handler is not None
        deadline = time.monotonic() + 10
        while True:
            with self.handler.lock:
                lines = self.handler.lines[mark:]
            found = sorted(served(lines).values(), key=lambda s: s.arrived)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"the handler answered {len(found)} invocations, not {count}")
            await asyncio.sleep(0.005)

    def mark(self) -> int:
        assert self.handler is not None
        with self.handler.lock:
            return len(self.handler.lines)


async def start_cluster(scratch: Path, profile: Path | None, loop: str) -> Cluster:
    started = Cluster(scratch, secret=secrets.token_hex(16))
    # The handler first: the server invokes every shard as it starts.
    handler = Child(
        handler_args(
            started.handler_port,
            started.port,
            started.secret_text,
            profile / "handler.prof" if profile else None,
            loop,
        )
    )
    started.handler = handler
    await handler.wait_for_async(r"Uvicorn running on", timeout=60)
    server = Child(
        server_args(
            scratch / "data",
            started.port,
            started.handler_port,
            started.secret,
            profile / "server.prof" if profile else None,
            trace=False,
        )
    )
    started.server = server  # type: ignore[assignment]  # a Child, which run_in stops
    await server.wait_for_async(r"ready$", timeout=60)
    started.client = await fusee.Client.connect(started.host_port)
    return started


# -- row 1, 2, 6: cold starts -------------------------------------------------------------


@dataclass
class ColdStart:
    began: float  # just before client.start (unix s)
    step: float  # the first step's body (unix s)
    served: Served
    shard: int

    @property
    def total_ms(self) -> float:
        return (self.step - self.began) * 1000

    @property
    def until_open_ms(self) -> float:
        return (self.served.at("opened") - self.began) * 1000

    @property
    def recovery_ms(self) -> float:
        return self.served.open_ms.get(self.shard, float("nan"))

    def parts_ms(self) -> dict[str, float]:
        s = self.served
        return {
            "dispatch": (s.arrived - self.began) * 1000,
            "connect": (s.at("connected") - s.arrived) * 1000,
            "grant": (s.at("leased") - s.at("connected")) * 1000,
            "open": (s.at("opened") - s.at("leased")) * 1000,
            "recovery": self.recovery_ms,
            "append": (s.at("appended") - s.at("opened")) * 1000,
            "durable": (s.at("durable") - s.at("appended")) * 1000,
            "step": (self.step - s.at("durable")) * 1000,
        }


async def cold_start(cluster: Cluster, wid: str, due_allowed: int = 0) -> ColdStart:
    await cluster.quiet(due_allowed)
    await asyncio.sleep(SETTLE_S)
    mark = cluster.mark()
    began = time.time()
    run = await cluster.client.start("first", wid, None)
    step = float(await run.result())
    found = await cluster.handled(mark, 1)
    # The invocation that ran the step: the last to arrive before it did.
    mine = max((s for s in found if s.arrived <= step), key=lambda s: s.arrived)
    return ColdStart(began, step, mine, cluster.client.shard_of(wid))


def ids_on(shard: int, prefix: str) -> Iterator[str]:
    """Workflow IDs that hash to `shard` (as the client routes them)."""
    i = 0
    while True:
        wid = f"{prefix}-{i}"
        if zlib.crc32(wid.encode()) % SHARDS == shard:
            yield wid
        i += 1


async def cold_starts(cluster: Cluster, count: int) -> list[ColdStart]:
    for i in range(WARM_UP_STARTS):
        await cold_start(cluster, f"warm-{i}")
    return [await cold_start(cluster, f"cold-{i}") for i in range(count)]


# -- rows 3, 4: fan-out --------------------------------------------------------------------


async def fan_out(cluster: Cluster, count: int, together: bool) -> tuple[int, int]:
    """(invocations, steps) that `count` workflows of FAN_STEPS steps took."""
    client = cluster.client
    before = (await cluster.quiet())["endpoints"][0]
    ids = [f"fan-{'together' if together else 'serial'}-{i}" for i in range(count)]
    if together:
        await asyncio.gather(*(client.start("fan", wid, FAN_STEPS) for wid in ids))
    else:
        for wid in ids:
            await client.start("fan", wid, FAN_STEPS)
    after = (await cluster.quiet())["endpoints"][0]
    # Read afterwards (their invocations are not counted above): every run finished.
    results = await asyncio.gather(*(client.run(wid).result() for wid in ids))
    expected = sum(range(FAN_STEPS))
    if any(result != expected for result in results):
        raise RuntimeError(f"fan-out results: {sorted(set(results))}, expected {expected}")
    return after["invocations"] - before["invocations"], after["steps"] - before["steps"]


# -- row 5: a step after a sleep -----------------------------------------------------------


@dataclass
class Sleeps:
    runs: list[tuple[int, float, float]]  # shard, the timer's due time, the step after (unix ms)
    invocations: list[Served]
    began: float

    @property
    def late_ms(self) -> list[float]:
        return [woke - due for _, due, woke in self.runs]

    def resumed(self) -> list[Served]:
        """The invocations after the sleep (the others ran the starts)."""
        return [s for s in self.invocations if s.arrived >= self.began + SLEEP_MS / 2000]

    def ahead_ms(self, event: str) -> list[float]:
        """Per invocation after the sleep: how long after the earliest timer of its
        shards `event` came (negative: before it)."""
        found = []
        for one in self.resumed():
            dues = [due for shard, due, _ in self.runs if shard in one.shards]
            if dues:
                found.append(one.at(event) * 1000 - min(dues))
        return found


async def sleeps(cluster: Cluster, count: int, prefix: str = "nap") -> Sleeps:
    client = cluster.client
    before = (await cluster.quiet())["endpoints"][0]
    mark = cluster.mark()
    began = time.time()

    async def one(wid: str) -> tuple[int, float, float]:
        # The result asked for at once, while the start's invocation holds the shard: it
        # waits at the server through the sleep and invokes nothing by itself.
        run = await client.start("nap", wid, SLEEP_MS)
        due, woke = await run.result()
        return run.shard, float(due), float(woke)

    runs = await asyncio.gather(*(one(f"{prefix}-{i}") for i in range(count)))
    after = (await cluster.quiet())["endpoints"][0]
    found = await cluster.handled(mark, after["invocations"] - before["invocations"])
    return Sleeps(list(runs), found, began)


async def wakeup_floor(cluster: Cluster, count: int = 100) -> tuple[float, float]:
    """p50 ms of an HTTP round trip to the handler (a GET, answered 405 at once) sent back
    to back, and sent after 20 ms of quiet, like a cold start's: what waking an idle
    process costs on this machine, paid at nearly every hop of a cold start."""
    import aiohttp

    url = f"http://127.0.0.1:{cluster.handler_port}/"
    found: list[float] = []
    async with aiohttp.ClientSession() as session:
        for gap in (0.0, SETTLE_S):
            times = []
            for _ in range(count):
                if gap:
                    await asyncio.sleep(gap)
                began = time.perf_counter()
                async with session.get(url) as response:
                    await response.read()
                times.append((time.perf_counter() - began) * 1000)
            found.append(pct(times, 50))
    return found[0], found[1]


async def long_lived_sleeps(cluster: Cluster, count: int) -> list[float]:
    """Row 5's runs on a long-lived worker that takes every shard (the server's invoker
    stays idle): how late the step after the sleep is there. The worker then leaves."""
    worker = Child(worker_args(cluster.port))
    try:
        await worker.wait_for_async(r"worker ready", timeout=60)
        await cluster.quiet()  # no invocation holds a shard the worker waits for
        await asyncio.sleep(0.2)  # (standbys take freed shards first: let it take them all)

        async def one(wid: str) -> float:
            run = await cluster.client.start("nap", wid, SLEEP_MS)
            due, woke = await run.result()
            return float(woke) - float(due)

        return list(await asyncio.gather(*(one(f"nap-long-{i}") for i in range(count))))
    finally:
        worker.stop()


async def local_sleeps(scratch: Path, count: int) -> list[float]:
    """Row 5's runs in local mode (an engine on a data directory, in this process, the
    same 4 shards, no server): the floor under both figures above on this machine. There
    too the step after the sleep waits until the timer's firing is on disk (a step's
    function sees only what a crash cannot take back) and the timer itself wakes an idle
    process."""
    from _invoke_procs import nap

    engine = await fusee.Engine.open(str(scratch / "local"), workflows=[nap], shards=SHARDS)
    try:

        async def one(wid: str) -> float:
            run = await engine.start(nap, wid, SLEEP_MS)
            due, woke = await run.result()
            return float(woke) - float(due)

        return list(await asyncio.gather(*(one(f"nap-local-{i}") for i in range(count))))
    finally:
        await engine.close()


# -- row 6: a shard holding parked runs -----------------------------------------------------


async def park(cluster: Cluster, shard: int, count: int) -> float:
    """Starts `count` runs asleep for an hour on `shard`; seconds it took, until the
    invocation that ran them was over."""
    began = time.monotonic()
    gate = asyncio.Semaphore(PARKED_CONCURRENCY)

    async def one(wid: str) -> None:
        async with gate:
            await cluster.client.start("parked", wid, None)

    ids = ids_on(shard, "parked")
    await asyncio.gather(*(one(next(ids)) for _ in range(count)))
    await cluster.quiet(due_allowed=1)  # that shard's timer, an hour off
    return time.monotonic() - began


# -- the report -------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{value:.1f} ms"


def table(rows: list[tuple[str, str]]) -> str:
    lines = ["| What | Result |", "| --- | --- |"]
    lines += [f"| {what} | {result} |" for what, result in rows]
    return "\n".join(lines)


def cold_rows(cold: list[ColdStart], floors: Floors) -> list[tuple[str, str]]:
    total = [c.total_ms for c in cold]
    until_open = [c.until_open_ms for c in cold]
    recovery = [c.recovery_ms for c in cold]
    p50 = pct(total, 50)
    floor = floors.cold_start_ms
    return [
        (
            "Start for a shard nobody holds, call to the first step's body",
            f"p50 {ms(p50)} ({times(p50, floor)} of {floor:.2f} ms), p90 {ms(pct(total, 90))}, "
            f"max {ms(max(total))} "
            + goal(p50 <= GOAL_COLD_FLOORS * floor, f"p50 \u2264 {GOAL_COLD_FLOORS:g}\u00d7 the floor"),
        ),
        (
            "Of which: until the engine is open and the workflows registered",
            f"p50 {ms(pct(until_open, 50))} (the shard's own recovery {ms(pct(recovery, 50))})",
        ),
    ]


def fan_row(what: str, invocations: int, steps: int, note: str = "") -> tuple[str, str]:
    per = steps / invocations if invocations else float("nan")
    return (
        what,
        f"{invocations} invocations, {per:.0f} steps each{note} "
        + goal(invocations == GOAL_FAN_INVOCATIONS, f"{GOAL_FAN_INVOCATIONS} invocations"),
    )


def sleep_row(result: Sleeps, floors: Floors) -> tuple[str, str]:
    late_p50 = pct(result.late_ms, 50)
    runs = len(result.late_ms)
    per_run_ms = sum(s.took_s for s in result.invocations) * 1000 / runs
    resumed = result.resumed()
    opens = [(s.at("opened") - s.at("leased")) * 1000 for s in result.invocations]
    return (
        "Step after a 1 s sleep, invoked",
        f"late by {ms(late_p50)} p50 ({times(late_p50, floors.wake_up_ms)} of {floors.wake_up_ms:.2f} ms; "
        f"p90 {ms(pct(result.late_ms, 90))}) "
        + goal(late_p50 <= GOAL_LATE_P50_MS, f"\u2264 {GOAL_LATE_P50_MS:g} ms")
        + f"; engine open {ms(statistics.mean(opens))} per invocation and invocation time "
        f"{ms(per_run_ms)} per resumed run ({runs} runs, {len(result.invocations)} invocations, "
        f"{len(resumed)} of them after the sleep: "
        f"{ms(sum(s.took_s for s in resumed) * 1000 / runs)} per run) "
        + goal(per_run_ms <= GOAL_TIME_PER_RUN_MS, f"\u2264 {GOAL_TIME_PER_RUN_MS:g} ms per run"),
    )


def parked_row(parked: int, cold: list[ColdStart], floors: Floors) -> tuple[str, str]:
    p50 = pct([c.total_ms for c in cold], 50)
    return (
        f"Start on a shard holding {parked:,} runs asleep for an hour",
        f"p50 {ms(p50)} ({times(p50, floors.cold_start_ms)}), of which recovery {ms(pct([c.recovery_ms for c in cold], 50))} "
        f"({len(cold)} starts) " + goal(p50 <= GOAL_PARKED_P50_MS, f"\u2264 {GOAL_PARKED_P50_MS:g} ms"),
    )


def breakdown(title: str, cold: list[ColdStart]) -> str:
    parts = [c.parts_ms() for c in cold]

    def p(key: str) -> str:
        values = [part[key] for part in parts]
        return f"p50 {pct(values, 50):6.2f} ms  p90 {pct(values, 90):6.2f} ms"

    return "\n".join(
        [
            f"{title} ({len(cold)} starts; p50s of the parts need not add up to the total's):",
            f"  client.start to the request at the handler (server dispatch, HTTP)  {p('dispatch')}",
            f"  to connected (the handler's TCP connect)                            {p('connect')}",
            f"  to leased (OPEN to WELCOME: the handshake and the grant)            {p('grant')}",
            f"  to opened (Engine.open)                                             {p('open')}",
            f"    of which the shard's own recovery (open_ms)                       {p('recovery')}",
            f"  to the first append sent (the start routed, its run begun)          {p('append')}",
            f"  to the append durable (its DURABLE back)                            {p('durable')}",
            f"  to the first step's body (the rest)                                 {p('step')}",
        ]
    )


def timers(result: Sleeps) -> str:
    arrived, opened = result.ahead_ms("received"), result.ahead_ms("opened")
    if not arrived:
        return "After the sleep: no invocation came after it"
    return (
        f"After the sleep ({len(arrived)} invocations), after each one's earliest timer: the request "
        f"reached the handler p50 {pct(arrived, 50):.1f} ms (min {min(arrived):.1f}), the engine was "
        f"open p50 {pct(opened, 50):.1f} ms; the step after each timer ran p50 "
        f"{pct(result.late_ms, 50):.1f} ms late (min {min(result.late_ms):.1f}, max {max(result.late_ms):.1f})."
    )


# -- the whole run ----------------------------------------------------------------------------


async def run_only(args: argparse.Namespace, cluster: Cluster, progress: Progress, floors: Floors) -> None:
    """`--only`: row 5 for each count of `--sleepers`, or row 6, and nothing else."""
    print(floors.describe())
    if args.only == "sleeps":
        for round, count in enumerate(args.sleepers):
            slept = await sleeps(cluster, count, f"nap-{round}")  # fresh IDs: no earlier run read
            late = slept.late_ms
            p50 = pct(late, 50)
            print(
                f"Step after a 1 s sleep, invoked, {count} sleepers: late by p50 {ms(p50)} "
                f"({times(p50, floors.wake_up_ms)}: the wake-up floor, {floors.wake_up_ms:.2f} ms), "
                f"p90 {ms(pct(late, 90))} (min {ms(min(late))}, max {ms(max(late))}); "
                f"{len(slept.resumed())} invocations after the sleep"
            )
            print(timers(slept))
            progress(f"{count} runs sleeping 1 s")
        return
    parked_s = await park(cluster, 0, args.parked)
    progress(f"{args.parked:,} runs parked on shard 0 ({args.parked / parked_s:.0f} starts/s)")
    for i in range(WARM_UP_STARTS):
        await cold_start(cluster, f"warm-{i}", due_allowed=1)
    probes = ids_on(0, "probe")
    parked = [await cold_start(cluster, next(probes), due_allowed=1) for _ in range(max(5, args.cold // 5))]
    print(table([parked_row(args.parked, parked, floors)]))
    print(breakdown(f"On the shard holding {args.parked:,} runs", parked))


async def run_all(args: argparse.Namespace, scratch: Path) -> None:
    began = time.monotonic()
    cluster = await start_cluster(scratch, args.profile, args.loop)
    try:
        await cluster.quiet()  # the invocations of every shard a starting server sends
        progress = Progress(began)
        floors = await measure_floors(scratch)
        progress("the floors")
        if args.only:
            await run_only(args, cluster, progress, floors)
            return
        cold = await cold_starts(cluster, args.cold)
        progress(f"{args.cold} cold starts")
        at_once = await fan_out(cluster, args.fan, together=True)
        progress(f"{args.fan} workflows started at once")
        serial = await fan_out(cluster, args.fan, together=False)
        progress(f"{args.fan} workflows started one after another")
        slept = await sleeps(cluster, args.sleeps)
        progress(f"{args.sleeps} runs sleeping 1 s")
        shard = 0
        parked_s = await park(cluster, shard, args.parked)
        progress(f"{args.parked:,} runs parked on shard {shard} ({args.parked / parked_s:.0f} starts/s)")
        probes = ids_on(shard, "probe")
        samples = max(5, args.cold // 5)
        parked = [await cold_start(cluster, next(probes), due_allowed=1) for _ in range(samples)]
        progress(f"{samples} starts on the parked shard")
        asleep = [row async for row in cluster.client.list(type="parked", status="running")]
        if len(asleep) != args.parked or {r.shard for r in asleep} != {shard}:
            raise RuntimeError(
                f"{len(asleep)} parked runs found, on shards {sorted({r.shard for r in asleep})}"
            )
        floor = await wakeup_floor(cluster)
        long_lived = await long_lived_sleeps(cluster, args.sleeps)
        progress(f"{args.sleeps} runs sleeping 1 s on a long-lived worker")
        local = await local_sleeps(scratch, args.sleeps)
        progress(f"{args.sleeps} runs sleeping 1 s in local mode")
    finally:
        await cluster.client.close()
    rows = cold_rows(cold, floors)
    rows.append(fan_row(f"{args.fan} workflows of {FAN_STEPS} steps on 4 shards, started at once", *at_once))
    rows.append(fan_row("The same started one after another", *serial))
    rows.append(sleep_row(slept, floors))
    late = pct(long_lived, 50)
    rows.append(
        (
            "The same on a long-lived worker (no invoking)",
            f"late by {ms(late)} p50 ({times(late, floors.wake_up_ms)}; p90 {ms(pct(long_lived, 90))}): invoked is "
            f"{ms(pct(slept.late_ms, 50) - late)} later at p50",
        )
    )
    rows.append(
        (
            "The same in local mode (one process, no server)",
            f"late by {ms(pct(local, 50))} p50 ({times(pct(local, 50), floors.wake_up_ms)}; "
            f"p90 {ms(pct(local, 90))}): invoked is "
            f"{ms(pct(slept.late_ms, 50) - pct(local, 50))} later at p50",
        )
    )
    rows.append(parked_row(args.parked, parked, floors))
    print()
    print(table(rows))
    print()
    print(breakdown("Cold start, where the time goes", cold))
    print(breakdown(f"On the shard holding {args.parked:,} runs", parked))
    print(timers(slept))
    print(floors.describe())
    print(
        f"This machine's floor: an HTTP round trip to the handler (a GET answered at once) takes "
        f"p50 {floor[0]:.2f} ms back to back and {floor[1]:.2f} ms after {SETTLE_S * 1000:.0f} ms of "
        f"quiet, as a cold start's hops do (each wakes a process that was idle)."
    )
    print(
        f"\nServer, handler (uvicorn --loop {args.loop}, FUSEE_INVOKE_TRACE=1) and client in three processes on "
        f"loopback, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.2f} at the end); "
        f"{time.monotonic() - began:.0f} s in all"
        + (f"; under cProfile (stats in {args.profile})" if args.profile else "")
        + "."
    )


class Progress:
    """A line on standard error as each part ends."""

    def __init__(self, began: float) -> None:
        self.began = began

    def __call__(self, what: str) -> None:
        print(f"[{time.monotonic() - self.began:5.1f} s] {what}", file=sys.stderr, flush=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("cold", type=int, nargs="?", default=100, help="cold starts (default 100)")
    parser.add_argument("fan", type=int, nargs="?", default=200, help="fan-out workflows (default 200)")
    parser.add_argument("sleeps", type=int, nargs="?", default=100, help="runs sleeping 1 s (default 100)")
    parser.add_argument(
        "parked", type=int, nargs="?", default=10_000, help="runs parked on one shard (default 10000)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 20 10 500")
    parser.add_argument(
        "--only", choices=("sleeps", "parked"), help="row 5 alone (each --sleepers), or row 6"
    )
    parser.add_argument("--sleepers", help="with --only sleeps: comma-separated counts (default SLEEPS)")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the handler's event loop under uvicorn (default asyncio, as the examples deploy it)",
    )
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()), help="parent of the scratch directory"
    )
    parser.add_argument(
        "--profile", type=Path, help="run the server and the handler under cProfile, stats here"
    )
    args = parser.parse_args()
    if args.quick:
        args.cold, args.fan, args.sleeps, args.parked = 10, 20, 10, 500
    args.sleepers = [int(n) for n in args.sleepers.split(",")] if args.sleepers else [args.sleeps]
    if min(args.cold, args.fan, args.sleeps, args.parked, *args.sleepers) < 1:
        parser.error("every count must be at least 1")
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    return args


def main() -> int:
    args = arguments()
    scratch = Path(tempfile.mkdtemp(prefix="fusee-invoke-cost-", dir=args.dir.resolve()))
    return run_in(scratch, run_all(args, scratch))


if __name__ == "__main__":
    sys.exit(main())
