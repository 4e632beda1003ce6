"""Debounce and batching on invoked workers (docs/coordinators.md): `fusee server
--invoke` POSTing to uvicorn serving `handlers.asgi:app`, four client processes
(tests/invoke/coordinator_client.py) sending debounce and batch events with event IDs.

Every acknowledged event must be in exactly one window, the one its receipt named, once;
every run must start no earlier than its window allows. With the handler SIGKILLed over
and over (a new one on its port, the server invoking it again) a late start is expected:
a window that closes while no handler answers starts when one does. So how late a run
may be is asserted where nothing is killed, and printed in both."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import statistics
import sys
from pathlib import Path

import pytest

import fusee
from tests.invoke.coordinator_client import SETTINGS
from tests.support.cluster import Cluster, outputs, quiet
from tests.support.procs import Proc, listed, retry

WINDOW_MS = 200
DEBOUNCE_MAX_WAIT_MS = 600
BATCH_MAX_WAIT_MS = 300
MAX_EVENTS = 5
assert SETTINGS["debounce"] == {"window": f"{WINDOW_MS}ms", "max_wait": f"{DEBOUNCE_MAX_WAIT_MS}ms"}
assert SETTINGS["batch"] == {"max_events": MAX_EVENTS, "max_wait": f"{BATCH_MAX_WAIT_MS}ms"}
# A run's start record is stamped in whole milliseconds; the clients' times are not.
ROUNDING_MS = 1.0


@dataclasses.dataclass
class Ack:
    kind: str
    key: str
    event: str
    run: str
    sent: float  # the first send (ms, wall clock): the coordinator took it in after
    acked: float  # its acknowledgement: the coordinator took it in before


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


def start_clients(cluster: Cluster, procs: list[Proc], events: int, seed: int) -> list[Proc]:
    module = "tests.invoke.coordinator_client"
    clients = [
        Proc([sys.executable, "-m", module, cluster.host_port, str(c), str(events), str(seed)])
        for c in range(4)
    ]
    procs.extend(clients)
    return clients


def acks(clients: list[Proc]) -> dict[str, Ack]:
    found: dict[str, Ack] = {}
    for c in clients:
        for line in list(c.lines):
            if line.startswith("ack "):
                _, kind, key, event, rid, sent, acked = line.split()
                assert event not in found, line
                found[event] = Ack(kind, key, event, rid, float(sent), float(acked))
    return found


def deadline(kind: str, window: list[Ack], full: bool) -> tuple[float, float]:
    """The earliest and latest time the window's run is due, from its events' send and
    acknowledgement times (each event was taken in between the two)."""
    first_sent, first_acked = min(a.sent for a in window), min(a.acked for a in window)
    last_sent, last_acked = max(a.sent for a in window), max(a.acked for a in window)
    if kind == "debounce":
        return (
            min(last_sent + WINDOW_MS, first_sent + DEBOUNCE_MAX_WAIT_MS),
            min(last_acked + WINDOW_MS, first_acked + DEBOUNCE_MAX_WAIT_MS),
        )
    if full:  # started by the event that filled it, unless max_wait came first
        return min(last_sent, first_sent + BATCH_MAX_WAIT_MS), min(
            last_acked, first_acked + BATCH_MAX_WAIT_MS
        )
    return first_sent + BATCH_MAX_WAIT_MS, first_acked + BATCH_MAX_WAIT_MS


async def check_runs(client: fusee.Client, acked: dict[str, Ack]) -> dict[str, list[float]]:
    """Each acknowledged event in the run its receipt named and in no other, once; each
    debounced run with its window's latest input; no run besides those named; none started
    before it was due. How late each started after it was due at the latest (ms), by kind:
    the due time is known to within an event's round trip (a few ms; the coordinator took
    the event in between its send and its acknowledgement), and this is the lower figure."""
    windows: dict[str, list[Ack]] = {}
    for a in acked.values():
        windows.setdefault(a.run, []).append(a)
    gate = asyncio.Semaphore(16)  # calls in flight keep the shards held: no invocation each

    async def read(rid: str) -> tuple[list[str], int]:
        """The run's input (its result) and when it started."""
        async with gate:
            run = client.run(rid)
            # The last windows close up to max_wait after the last event: each comes to exist.
            try:
                await asyncio.wait_for(run.started(), 60)
            except TimeoutError:
                raise AssertionError(await never_started(client, windows[rid])) from None
            got = await retry(lambda: run.result(), timeout=60)
            return got, (await retry(lambda: run.describe())).journal[0].now

    ids = sorted(windows)
    found = dict(zip(ids, await asyncio.gather(*(read(rid) for rid in ids)), strict=True))
    seen: dict[str, str] = {}
    late: dict[str, list[float]] = {"debounce": [], "batch": []}
    for rid, window in sorted(windows.items()):
        kind = window[0].kind
        assert {a.kind for a in window} == {kind} and len({a.key for a in window}) == 1, window
        got, started = found[rid]
        if kind == "batch":
            assert len(got) == len(set(got)) <= MAX_EVENTS, (rid, got)
            assert sorted(got) == sorted(a.event for a in window), (rid, got, window)
            taken = got
        else:
            # The latest input: no event of the window was sent after it was acknowledged.
            [event] = got
            latest = acked[event]
            assert latest.run == rid, (rid, latest)
            assert not [a for a in window if a.sent > latest.acked], (rid, latest, window)
            taken = [a.event for a in window]
        for event in taken:
            assert event not in seen, f"{event} in {seen[event]} and {rid}"
            seen[event] = rid
        earliest, latest_due = deadline(kind, window, len(got) == MAX_EVENTS)
        assert started >= earliest - ROUNDING_MS, (rid, kind, started - earliest, window)
        late[kind].append(started - latest_due)
    assert seen == {e: a.run for e, a in acked.items()}
    runs = {row.id for row in await retry(lambda: listed(client, type="gather"))}
    assert runs == set(windows), runs ^ set(windows)  # no run besides those named by receipts
    return late


async def never_started(client: fusee.Client, window: list[Ack]) -> str:
    """What a failure says of a window whose run never came to exist: its events, and its
    key's coordinator as it describes itself, with the last records of its journal."""
    coordinator = client.run(f"fusee.{window[0].kind}/gather/{window[0].key}")
    described = await coordinator.describe()
    journal = described.journal
    opened = next((i for i, r in enumerate(journal) if window[0].run in repr(r)), len(journal))
    shown = journal[max(0, opened - 30) : opened + 30] + journal[-10:]
    records = "\n".join(repr(record)[:300] for record in shown)
    state = await retry(lambda: coordinator.query("describe"))
    return (
        f"the run {window[0].run} never started; its window: {window}\n"
        f"{described.summary}: {state}\n{records}"
    )


def summary(late: dict[str, list[float]]) -> str:
    parts = []
    for kind, values in late.items():
        cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
        parts.append(
            f"{kind}: {len(values)} runs, ms after due p50 {cuts[49]:.0f} p90 {cuts[89]:.0f} max {max(values):.0f}"
        )
    return "; ".join(parts)


EVENTS = [60, pytest.param(250, marks=[pytest.mark.slow, pytest.mark.timeout(300)], id="1000-events")]


@pytest.mark.parametrize("events", EVENTS)
async def test_four_clients_debounce_and_batch_through_handler_kills_each_event_once(cluster, procs, events):
    cluster.start_handler()
    cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)  # the server's first invocations, done
    clients = start_clients(cluster, procs, events, seed=1)
    kills = 0
    while kills < events // 10:
        await asyncio.sleep(1.0)
        if any("done" in c.lines for c in clients):
            break
        assert len(acks(clients)) < 4 * events  # killed under load
        handler = cluster.kill_handler()  # mid-invocation: the server invokes the new one
        kills += 1
        # The next kill once the new handler has answered an invocation (or 5 s on): a
        # success ends the endpoint's backoff. Killed faster than that, the endpoint
        # fails in a row, backs off up to 30 s, and a window due meanwhile waits it out.
        with contextlib.suppress(AssertionError):
            await handler.wait_for_async(r"answered status=200", timeout=5)
    for c in clients:
        try:
            await c.wait_for_async(r"^done$", timeout=120)
        except BaseException:
            print(outputs([*clients, cluster.server]))
            raise
    assert kills >= 2
    acked = acks(clients)
    assert len(acked) == 4 * events
    late = await check_runs(client, acked)
    retries = collections.Counter(
        line.split()[2] for c in clients for line in list(c.lines) if line.startswith("retry ")
    )
    print(f"{4 * events} events, {kills} handler kills, sent again {dict(retries)}; {summary(late)}")
    assert not cluster.problems(), cluster.problems()
    await client.close()


@pytest.mark.parametrize("events", EVENTS)
async def test_four_clients_debounce_and_batch_start_within_100_ms_of_due_at_p50(cluster, procs, events):
    cluster.start_handler()
    cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    clients = start_clients(cluster, procs, events, seed=2)
    for c in clients:
        await c.wait_for_async(r"^done$", timeout=120)
    acked = acks(clients)
    assert len(acked) == 4 * events
    late = await check_runs(client, acked)
    print(f"{4 * events} events; {summary(late)}")
    # Within 100 ms of due at p50, and none two seconds late: on the shared 2-core
    # machine a loaded moment stalls the one handler process (240 events: p90 9 to 17 ms
    # at a load average of 5, 34 to 67 ms at 7; 1,000 events: p90 177 to 448 ms).
    everything = late["debounce"] + late["batch"]
    assert statistics.median(everything) <= 100, summary(late)
    assert max(everything) < 2000, summary(late)
    assert not cluster.problems(), cluster.problems()
    await client.close()
