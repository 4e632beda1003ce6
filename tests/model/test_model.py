"""The model-based test: seeded random sequences of API calls against a TestEngine, with
crashes, clean reopenings and code changes in between, on every storage, checking the
guarantees (tests/model/checks.py) after every step.

Callers also wait across steps: a `result()` left waiting (`wait_result`), and calls that
arrive as a parked run's timer wakes it (`call_at_wake`: a result, an update, a signal, a
query, the clock moved under the call's read); the checks hold the engine to answering
every waiter once its run ended, and to telling it when its engine closed.

A failure prints its seed, the shrunk sequence of rules and the same sequence as the
Python calls it made (the "program"). Keep each distinct failure as a small standalone
test in tests/model/test_found.py.

`test_model_flow` runs the same machine with the flow-control moves added (schedules,
a limit, debounce and batches: features.py), whose promises are checked after every step
too.

The default run is deterministic (a fixed seed per storage); `--run-slow` runs many more
sequences from a random seed, printed; `FUSEE_MODEL_SEED=N` repeats one.
"""

from __future__ import annotations

import gc
import os
import random
import time
import warnings
from typing import Any

import pytest
from hypothesis import note
from hypothesis import seed as use_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, invariant, rule

from .calls import Calls
from .checks import check, check_progress
from .features import EVENT_IDS, KEYS, LIMITED_IDS, SCHEDULES, Features
from .harness import FAULT_TOTALS, IDS, POLICIES, UPDATES, WIDS, model_settings
from .known import AVOID
from .object_moves import OBJECT_KEYS, ObjectMoves

# "faulty": memory storage whose durability comes a loop turn later, wrapped by
# fusee.testing.faults.FaultyStorage (late and bursty durable positions, slow reads, and
# now and then a failed flush, a refused run-store frame or a lost lease: the process then
# restarts). Its fault seed is drawn with the sequence, so a failure repeats and shrinks.
MODES = ("instant", "flush_on_turn", "local", "faulty")
DEFAULT_EXAMPLES = {"instant": 150, "flush_on_turn": 150, "local": 60, "faulty": 100}
SLOW_EXAMPLES = {"instant": 3000, "flush_on_turn": 3000, "local": 1000, "faulty": 3000}
DEFAULT_SEEDS = {"instant": 1, "flush_on_turn": 2, "local": 3, "faulty": 4}
FLOW_EXAMPLES = {"instant": 60, "flush_on_turn": 60, "local": 15, "faulty": 30}
SLOW_FLOW_EXAMPLES = {"instant": 1000, "flush_on_turn": 1000, "local": 300, "faulty": 1000}
STEPS = int(os.environ.get("FUSEE_MODEL_STEPS", 30))  # rules per sequence
FAR_MS = (
    60_000  # past every timer a plan sets (sleeps, waits and retries of seconds, 20 s and 30 s deadlines)
)

ITEMS = st.one_of(
    st.sampled_from(
        [
            "step",
            "step",
            "thread",
            "wait",
            "wait",
            "comp",
            "await",
            "all",
            "cas",
            "gate",
            "compg",
            "beat",
            "attr",
            "stream",
        ]
    ),
    st.sampled_from(["fail:1", "fail:2", "fail:3"]),
    st.sampled_from(["sleep:300", "sleep:2000", "waitt:500", "waitt:5000"]),
    st.sampled_from(
        [f"{k}:{p}" for k in ("child", "spawn") for p in ("terminate", "request-cancel", "abandon")]
    ),
    st.builds(
        lambda kind, target: f"{kind}:{target}", st.sampled_from(["sigwf", "cancelwf"]), st.sampled_from(IDS)
    ),
)
PLANS = st.lists(ITEMS, min_size=1, max_size=6)


def avoid(plan: list[str]) -> list[str]:
    return [item for item in plan if not any(item.startswith(prefix) for prefix in AVOID.get("items", ()))]


class EngineModel(RuleBasedStateMachine):
    mode = "instant"
    flow = False  # FlowModel: with the flow-control moves
    f: Features | None
    objects: ObjectMoves | None

    def __init__(self) -> None:
        super().__init__()
        self.h = Calls(self.mode)
        self.h.note = note
        self.f = Features(self.h) if self.flow else None
        self.objects = ObjectMoves(self.h) if self.flow else None

    @initialize()
    def open(self) -> None:
        self.h.run(self.h.open())

    def teardown(self) -> None:
        self.h.close()

    @invariant()
    def guarantees_hold(self) -> None:
        if hasattr(self.h, "t"):
            try:
                self.h.run(check(self.h))
                if self.f is not None:
                    self.h.run(self.f.check())
                if self.objects is not None:
                    self.h.run(self.objects.check())
            except AssertionError:
                note("# the program, as Python:\n" + self.h.program())
                raise

    # -- calls -----------------------------------------------------------------------------

    @rule(
        wid=WIDS,
        plan=PLANS,
        policy=POLICIES,
        timed=st.booleans(),
        timeout=st.sampled_from([None, None, 30_000]),
    )
    def start(
        self, wid: str, plan: list[str], policy: dict[str, str], timed: bool, timeout: int | None
    ) -> None:
        self.h.run(self.h.start(wid, avoid(plan), policy, timed, timeout))

    @rule(wid=WIDS, good=st.booleans(), with_id=st.booleans())
    def signal(self, wid: str, good: bool, with_id: bool) -> None:
        if not good and "wrong-type-signal" in AVOID:
            return
        self.h.run(self.h.signal(wid, good, with_id and good))

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
        self.h.run(self.h.signal_with_start(wid, avoid(plan), timed))

    @rule(wid=WIDS, plan=PLANS, twice=st.booleans())
    def update_with_start(self, wid: str, plan: list[str], twice: bool) -> None:
        if twice and "concurrent-update-with-start" in AVOID:
            twice = False
        self.h.run(self.h.update_with_start(wid, avoid(plan), twice))

    @rule(wid=WIDS, twice=st.booleans())
    def cancel(self, wid: str, twice: bool) -> None:
        if twice and "second-cancel" in AVOID:
            twice = False
        self.h.run(self.h.cancel(wid, twice))

    @rule(wid=WIDS)
    def terminate(self, wid: str) -> None:
        self.h.run(self.h.terminate(wid))

    @rule(index=st.integers(0, 20), ok=st.booleans())
    def complete(self, index: int, ok: bool) -> None:
        self.h.run(self.h.complete(index, ok))

    @rule(wid=WIDS)
    def wait_result(self, wid: str) -> None:
        self.h.wait_result(wid)

    @rule(
        pick=st.integers(0, 7),
        kind=st.sampled_from(["result", "result", "update", "signal", "query"]),
        turns=st.integers(0, 4),
        repark=st.sampled_from([None, None, 2, 4, 6, 8]),
    )
    def call_at_wake(self, pick: int, kind: str, turns: int, repark: int | None) -> None:
        self.h.run(self.h.call_at_wake(pick, kind, turns, repark))

    @rule()
    def open_valve(self) -> None:
        self.h.run(self.h.open_valve())

    # -- time, crashes, deploys --------------------------------------------------------------

    @rule(ms=st.sampled_from([50, 300, 1_000, 5_000]))
    def advance(self, ms: int) -> None:
        self.h.run(self.h.advance(ms))

    @rule()
    def advance_far(self) -> None:
        restarts = self.h.restarts
        self.h.run(self.h.advance(FAR_MS))
        if self.h.restarts > restarts:
            # Faulty storage: a shard stopped on the way and the process restarted; the
            # restarted engine gets its own minute (with no fault that stops a shard).
            with self.h.calm():
                self.h.run(self.h.advance(FAR_MS))
        try:
            with self.h.calm():
                self.h.run(check_progress(self.h))
                if self.f is not None:
                    self.h.run(self.f.check(far=True))
                if self.objects is not None:
                    self.h.run(self.objects.check())
        except AssertionError:
            note("# the program, as Python:\n" + self.h.program())
            raise

    @rule(settle=st.booleans())
    def crash(self, settle: bool) -> None:
        self.h.run(self.h.crash(settle))

    @rule(
        op=st.sampled_from(["start", "signal", "update", "cancel", "terminate", "signal_with_start"]),
        wid=WIDS,
        plan=PLANS,
        turns=st.integers(1, 6),
    )
    def crash_during(self, op: str, wid: str, plan: list[str], turns: int) -> None:
        h = self.h
        calls: dict[str, Any] = {
            "start": lambda: h.start(wid, avoid(plan), {"running": "use-existing"}, False, None),
            "signal": lambda: h.signal(wid, True),
            "update": lambda: h.update(wid, "step"),
            "cancel": lambda: h.cancel(wid, False),
            "terminate": lambda: h.terminate(wid),
            "signal_with_start": lambda: h.signal_with_start(wid, avoid(plan), False),
        }
        h.run(h.then_crash(calls[op], turns))

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        self.h.run(self.h.restart(self.h.code, clean))

    @rule(code=st.sampled_from(["right", "right", "changed", "absent", "patched"]), clean=st.booleans())
    def deploy(self, code: str, clean: bool) -> None:
        if code == "changed" and "changed-code" in AVOID:
            code = "right"
        if code == "absent" and "absent-code" in AVOID:
            code = "right"
        self.h.run(self.h.restart(code, clean))


class FlowModel(EngineModel):
    """The model with the flow-control moves (issue 20) added to every other: schedules,
    the limit, debounce and batches (features.py), their promises checked after every step
    too. A machine of its own, so each keeps its default run short."""

    flow = True

    # -- flow control: schedules, the limit, debounce and batches (features.py) --------------

    @rule(name=st.sampled_from(sorted(SCHEDULES)))
    def schedule(self, name: str) -> None:
        self.h.run(self.f.schedule(name))

    @rule(
        name=st.sampled_from(sorted(SCHEDULES)),
        op=st.sampled_from(["pause", "resume", "resume", "trigger", "delete"]),
    )
    def schedule_control(self, name: str, op: str) -> None:
        self.h.run(self.f.control(name, op))

    @rule(concurrent=st.integers(1, 3), per_second=st.sampled_from([None, None, 5]))
    def define_limit(self, concurrent: int, per_second: int | None) -> None:
        self.h.run(self.f.define_limit(concurrent, per_second))

    @rule(
        wid=st.sampled_from(LIMITED_IDS),
        job=st.fixed_dictionaries(
            {
                "n": st.integers(1, 3),
                "priority": st.integers(0, 2),
                "key": st.sampled_from([None, "t1", "t2"]),
                "weight": st.integers(1, 2),
                "fail": st.booleans(),
            }
        ),
    )
    def start_limited(self, wid: str, job: dict[str, Any]) -> None:
        self.h.run(self.f.start_limited(wid, job))

    @rule(
        kind=st.sampled_from(["debounce", "batch"]), key=st.sampled_from(KEYS), eid=st.sampled_from(EVENT_IDS)
    )
    def send_event(self, kind: str, key: str, eid: str | None) -> None:
        self.h.run(self.f.send(kind, key, eid))

    @rule(
        kind=st.sampled_from(["debounce", "batch"]),
        key=st.sampled_from(KEYS),
        eid=st.sampled_from(EVENT_IDS),
        turns=st.integers(1, 6),
    )
    def send_event_then_crash(self, kind: str, key: str, eid: str | None, turns: int) -> None:
        self.h.run(self.f.send_then_crash(kind, key, eid, turns))

    # -- objects (object_moves.py) -------------------------------------------------------------

    @rule(key=st.sampled_from(OBJECT_KEYS), with_id=st.booleans())
    def object_call(self, key: str, with_id: bool) -> None:
        self.h.run(self.objects.call(key, with_id))

    @rule(key=st.sampled_from(OBJECT_KEYS), turns=st.integers(1, 8))
    def object_call_then_crash(self, key: str, turns: int) -> None:
        self.h.run(self.objects.call_then_crash(key, turns))

    @rule(key=st.sampled_from(OBJECT_KEYS), acked=st.booleans())
    def object_call_again(self, key: str, acked: bool) -> None:
        self.h.run(self.objects.again(key, acked))

    @rule(key=st.sampled_from(OBJECT_KEYS))
    def object_edit(self, key: str) -> None:
        self.h.run(self.objects.edit(key))

    @rule(key=st.sampled_from(OBJECT_KEYS))
    def object_peek(self, key: str) -> None:
        self.h.run(self.objects.peek(key))


class FaultyModel(EngineModel):
    mode = "faulty"

    @initialize(fault_seed=st.integers(0, 2**32 - 1))
    def open(self, fault_seed: int) -> None:  # type: ignore[override]
        self.h.run(self.h.open(fault_seed))


class FaultyFlowModel(FlowModel, FaultyModel):
    pass


def machine_for(mode: str, flow: bool = False) -> type[EngineModel]:
    if flow:
        base: type[EngineModel] = FaultyFlowModel if mode == "faulty" else FlowModel
    else:
        base = FaultyModel if mode == "faulty" else EngineModel
    return type(f"{base.__name__}_{mode}", (base,), {"mode": mode})


def run_model(mode: str, examples: int, seed: int, flow: bool = False) -> None:
    test = get_state_machine_test(
        machine_for(mode, flow),
        settings=model_settings(examples, STEPS, explain=bool(os.environ.get("FUSEE_MODEL_EXPLAIN"))),
    )
    started = time.monotonic()
    FAULT_TOTALS.clear()
    try:
        with warnings.catch_warnings():
            if "unawaited-step" in AVOID:
                # known: a step's coroutine the engine never ran warns when collected,
                # possibly during a later sequence
                warnings.filterwarnings("ignore", "coroutine '_gated", RuntimeWarning)
            use_seed(seed)(test)()
    except BaseException as error:
        what = "model test with the flow-control moves" if flow else "model test"
        error.add_note(f"{what} on {mode} storage: seed {seed} (repeat: FUSEE_MODEL_SEED={seed})")
        raise
    finally:
        gc.unfreeze()
        label = f"{mode}, flow" if flow else mode
        print(f"model[{label}]: {examples} sequences from seed {seed} in {time.monotonic() - started:.1f} s")
        if mode == "faulty":
            counts = ", ".join(
                f"{kind} {n}" for kind, n in sorted(FAULT_TOTALS.items()) if kind != "sequences"
            )
            print(f"model[faulty]: injected over {FAULT_TOTALS['sequences']} sequences: {counts}")


def _seed(mode: str, slow: bool) -> int:
    if "FUSEE_MODEL_SEED" in os.environ:
        return int(os.environ["FUSEE_MODEL_SEED"])
    return random.randrange(1 << 32) if slow else DEFAULT_SEEDS[mode]


@pytest.mark.parametrize("mode", MODES)
def test_model(mode: str) -> None:
    examples = int(os.environ.get("FUSEE_MODEL_EXAMPLES", DEFAULT_EXAMPLES[mode]))
    run_model(mode, examples, _seed(mode, slow=False))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", MODES)
def test_model_long(mode: str) -> None:
    run_model(mode, SLOW_EXAMPLES[mode], _seed(mode, slow=True))


@pytest.mark.timeout(240)  # (a shared machine: about 10 to 40 s each)
@pytest.mark.parametrize("mode", MODES)
def test_model_flow(mode: str) -> None:
    """The flow-control moves among the others (features.py); fewer sequences by default
    than the plain model's, as each step checks more."""
    examples = int(os.environ.get("FUSEE_MODEL_EXAMPLES", FLOW_EXAMPLES[mode]))
    run_model(mode, examples, _seed(mode, slow=False), flow=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", MODES)
def test_model_flow_long(mode: str) -> None:
    run_model(mode, SLOW_FLOW_EXAMPLES[mode], _seed(mode, slow=True), flow=True)
