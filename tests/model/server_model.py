"""The model-based test in server mode: seeded random sequences of the same calls as
test_model.py, made through a `fusee.Client` against a real `fusee server` with two
worker processes holding two shards each and a standby (server_cluster.py), with worker
SIGKILLs (between calls and mid-call), a holder's clean exit (SIGTERM) mid-call, a holder
SIGSTOPped until its leases move, and the server SIGKILLed and restarted on its directory
as further moves; the guarantees checked
after every step (server_checks.py says which are kept, changed and dropped). The
in-process model's clock moves (`advance`) become real pauses and a `settle` that lets
every timer pass; its crashes and reopenings become the moves above (its deploys of
changed or absent code have no counterpart here yet).

Each move costs real process time, so the default run is a few short sequences from a
fixed seed; `--run-slow` runs more and longer ones from a random seed, printed;
`FUSEE_MODEL_SEED=N` repeats one (the timing of the processes is not repeated: a failure
that depends on it may take a few runs). A failure prints the shrunk sequence of rules and
the calls it made; shrinking stops after FUSEE_MODEL_SHRINK_S seconds (default 300).
"""

from __future__ import annotations

import os
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import note
from hypothesis import seed as use_seed
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)

from .harness import IDS, POLICIES, SHARDS, UPDATES, WIDS, model_settings
from .server_checks import check, check_progress
from .server_harness import ServerCalls, Store

# The plans of test_model.py with real-time durations kept short: sleeps and waits of at
# most 1.5 s (2 s and 5 s on the virtual clock), and model.timed's timeout is 3 s here.
# Time passes while the test works (a move takes seconds), so runs that only sleep end
# soon after they start: one `step` less, and a `wait` and an `await` more, keep more of
# them waiting for a call.
ITEMS = st.one_of(
    st.sampled_from(
        ["step", "thread", "wait", "wait", "wait", "await", "await", "comp", "all", "cas", "gate", "compg"]
    ),
    st.sampled_from(["fail:1", "fail:2", "fail:3"]),
    st.sampled_from(["sleep:300", "sleep:1000", "waitt:500", "waitt:1500"]),
    st.sampled_from(
        [f"{k}:{p}" for k in ("child", "spawn") for p in ("terminate", "request-cancel", "abandon")]
    ),
    st.builds(
        lambda kind, target: f"{kind}:{target}", st.sampled_from(["sigwf", "cancelwf"]), st.sampled_from(IDS)
    ),
)
PLANS = st.lists(ITEMS, min_size=1, max_size=6)
OPS = st.sampled_from(
    ["start", "signal", "update", "cancel", "terminate", "signal_with_start", "update_with_start"]
)
DELAYS_MS = st.sampled_from([0, 0, 1, 2, 5, 20])  # after the call was sent

DEFAULT_EXAMPLES, DEFAULT_STEPS, DEFAULT_SEED, DEFAULT_STOPS = 6, 20, 5, 1
SLOW_EXAMPLES, SLOW_STEPS, SLOW_STOPS = 40, 30, 3
PG_EXAMPLES = 3  # each failover of a server costs its lease (5 s) and more
EXAMPLES = int(os.environ.get("FUSEE_MODEL_SERVER_EXAMPLES", 0))
STEPS = int(os.environ.get("FUSEE_MODEL_SERVER_STEPS", 0))
SHRINK_S = float(os.environ.get("FUSEE_MODEL_SHRINK_S", 300))
TOTALS: dict[str, float] = {}
FAILED_AT: list[float] = []  # when the first failing sequence failed (shrinking stops SHRINK_S later)
SMALLEST: list[str] = []  # the shortest failing program so far, and its error


class Recorded(ServerCalls):
    skip = False  # shrinking ran out of time: the sequence passes without running

    def run(self, coro: Awaitable[Any]) -> Any:
        if self.skip:
            coro.close()  # type: ignore[attr-defined]
            return None
        try:
            return super().run(coro)
        except Exception as error:
            if not FAILED_AT:
                FAILED_AT.append(time.monotonic())
            program = self.program()
            if not SMALLEST or program.count("\n") < SMALLEST[0].count("\n"):
                SMALLEST[:] = [program, f"{type(error).__name__}: {error}"]
            raise


class ServerModel(RuleBasedStateMachine):
    max_stops = DEFAULT_STOPS
    store: Store = None  # run_server_model's: the PostgreSQL store's moves join in

    def __init__(self) -> None:
        super().__init__()
        self.h = Recorded(self.store)
        self.h.note = note
        self.stops = 0

    @initialize()
    def open(self) -> None:
        # Once shrinking has had SHRINK_S, every further candidate passes at once (drawing
        # what it would have drawn), so the shrinker ends; the smallest failure found is
        # run once more for the report.
        if FAILED_AT and time.monotonic() - FAILED_AT[0] > SHRINK_S and not current_build_context().is_final:
            self.h.skip = True
            return
        self.h.run(self.h.open())

    def teardown(self) -> None:
        TOTALS["sequences"] = TOTALS.get("sequences", 0) + 1
        TOTALS["moves"] = TOTALS.get("moves", 0) + self.h.moves
        self.h.close()

    @invariant()
    def guarantees_hold(self) -> None:
        if self.h.cluster is not None and not self.h.skip:
            self._checked(check)

    def _checked(self, what: Callable[[ServerCalls], Awaitable[None]]) -> None:
        try:
            self.h.run(what(self.h))
        except AssertionError:
            note("# the program, as Python:\n" + self.h.program())
            raise

    def op(self, op: str, wid: str, plan: list[str]) -> Callable[[], Awaitable[None]]:
        h = self.h
        calls: dict[str, Callable[[], Awaitable[None]]] = {
            "start": lambda: h.start(wid, plan, {"running": "use-existing"}, False, None),
            "signal": lambda: h.signal(wid, True),
            "update": lambda: h.update(wid, "step"),
            "cancel": lambda: h.cancel(wid, False),
            "terminate": lambda: h.terminate(wid),
            "signal_with_start": lambda: h.signal_with_start(wid, plan, False),
            "update_with_start": lambda: h.update_with_start(wid, plan, False),
        }
        return calls[op]

    # -- calls -----------------------------------------------------------------------------

    @rule(
        wid=WIDS,
        plan=PLANS,
        policy=POLICIES,
        timed=st.booleans(),
        timeout=st.sampled_from([None, None, 3_000]),
    )
    def start(
        self, wid: str, plan: list[str], policy: dict[str, str], timed: bool, timeout: int | None
    ) -> None:
        self.h.run(self.h.start(wid, plan, policy, timed, timeout))

    @rule(wid=WIDS, good=st.booleans())
    def signal(self, wid: str, good: bool) -> None:
        self.h.run(self.h.signal(wid, good))

    @rule(index=st.integers(0, 50))
    def repeat_signal(self, index: int) -> None:
        self.h.run(self.h.repeat_signal(index))

    @rule(wid=WIDS)
    def query(self, wid: str) -> None:
        self.h.run(self.h.query(wid))

    @rule(wid=WIDS, mode=UPDATES)
    def update(self, wid: str, mode: str) -> None:
        self.h.run(self.h.update(wid, mode))

    @rule(index=st.integers(0, 50))
    def repeat_update(self, index: int) -> None:
        self.h.run(self.h.repeat_update(index))

    @rule(wid=WIDS, plan=PLANS, timed=st.booleans())
    def signal_with_start(self, wid: str, plan: list[str], timed: bool) -> None:
        self.h.run(self.h.signal_with_start(wid, plan, timed))

    @rule(wid=WIDS, plan=PLANS, twice=st.booleans())
    def update_with_start(self, wid: str, plan: list[str], twice: bool) -> None:
        self.h.run(self.h.update_with_start(wid, plan, twice))

    @rule(wid=WIDS, twice=st.booleans())
    def cancel(self, wid: str, twice: bool) -> None:
        self.h.run(self.h.cancel(wid, twice))

    @rule(wid=WIDS)
    def terminate(self, wid: str) -> None:
        self.h.run(self.h.terminate(wid))

    @rule(index=st.integers(0, 20), ok=st.booleans())
    def complete(self, index: int, ok: bool) -> None:
        self.h.run(self.h.complete(index, ok))

    @rule()
    def open_valve(self) -> None:
        self.h.run(self.h.open_valve())

    # -- time and the cluster's moves --------------------------------------------------------

    @rule(ms=st.sampled_from([50, 300, 1_000]))
    def pause(self, ms: int) -> None:
        self.h.run(self.h.pause(ms))

    @rule()
    def settle(self) -> None:
        self._checked(check_progress)

    @rule(shard=st.sampled_from([*range(SHARDS), None]))
    def kill_worker(self, shard: int | None) -> None:
        self.h.run(self.h.kill_worker(shard))

    @rule(op=OPS, wid=WIDS, plan=PLANS, delay_ms=DELAYS_MS, server=st.booleans())
    def kill_during(self, op: str, wid: str, plan: list[str], delay_ms: int, server: bool) -> None:
        shard = zlib.crc32(wid.encode()) % SHARDS
        self.h.run(self.h.during(self.op(op, wid, plan), shard, delay_ms, "server" if server else "worker"))

    @rule(op=OPS, wid=WIDS, plan=PLANS, delay_ms=DELAYS_MS)
    def exit_during(self, op: str, wid: str, plan: list[str], delay_ms: int) -> None:
        """The holder of the call's shard exits cleanly (SIGTERM) while the call is under way."""
        shard = zlib.crc32(wid.encode()) % SHARDS
        self.h.run(self.h.during(self.op(op, wid, plan), shard, delay_ms, "exit"))

    @precondition(lambda self: self.stops < self.max_stops)
    @rule(op=OPS, wid=WIDS, plan=PLANS, delay_ms=DELAYS_MS)
    def stop_holder(self, op: str, wid: str, plan: list[str], delay_ms: int) -> None:
        self.stops += 1
        shard = zlib.crc32(wid.encode()) % SHARDS
        self.h.run(self.h.stop_holder(shard, self.op(op, wid, plan), delay_ms, check))

    @rule()
    def restart_server(self) -> None:
        self.h.run(self.h.restart_server())

    @precondition(lambda self: self.store is not None and self.stops < self.max_stops)
    @rule()
    def stop_server(self) -> None:
        self.stops += 1
        self.h.run(self.h.stop_server())

    @precondition(lambda self: self.store is not None)
    @rule()
    def restart_database(self) -> None:
        self.h.run(self.h.restart_database())


def run_server_model(examples: int, steps: int, seed: int, max_stops: int, store: Store = None) -> None:
    """`store`: a fresh PostgreSQL database per sequence (and its cluster), the servers on
    it, and the store's moves; None: a server on a data directory."""
    machine = type(
        "ServerModel_run",
        (ServerModel,),
        {"max_stops": max_stops, "store": staticmethod(store) if store else None},
    )
    test = get_state_machine_test(
        machine,
        settings=model_settings(examples, steps),
    )
    name = "server, PostgreSQL store" if store else "server"
    print(f"model[{name}]: seed {seed} (repeat: FUSEE_MODEL_SEED={seed})", flush=True)
    started = time.monotonic()
    TOTALS.clear()
    FAILED_AT.clear()
    SMALLEST.clear()
    try:
        use_seed(seed)(test)()
    except BaseException as error:
        error.add_note(f"model test in {name} mode: seed {seed} (repeat: FUSEE_MODEL_SEED={seed})")
        if SMALLEST and "Flaky" in type(error).__name__:  # (else the report has the sequence)
            error.add_note(f"the shortest failing sequence ({SMALLEST[1]}) made these calls:\n{SMALLEST[0]}")
        raise
    finally:
        print(
            f"model[{name}]: {examples} sequences of {steps} steps from seed {seed} in "
            f"{time.monotonic() - started:.1f} s ({int(TOTALS.get('sequences', 0))} run, "
            f"{int(TOTALS.get('moves', 0))} moves)"
        )


def _seed(slow: bool) -> int:
    if "FUSEE_MODEL_SEED" in os.environ:
        return int(os.environ["FUSEE_MODEL_SEED"])
    return random.randrange(1 << 32) if slow else DEFAULT_SEED
