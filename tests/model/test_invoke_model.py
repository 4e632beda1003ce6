"""The model test through invoked workers: seeded random sequences of the server mode's
calls (server_model.py), made through a `fusee.Client` against a real `fusee
server` whose only workers are the invocations it POSTs to uvicorn serving
`fusee.invocation_handler` (invoke_handler_app.py), with the handler SIGKILLed (between
calls and mid-call) and budget expiries (a gated step outliving its invocation's budget)
as moves, and the server SIGKILLed and restarted on its directory; the guarantees
checked after every step (invoke_checks.py says which are kept, added and dropped), and
after every quiet period (`settle`) no worker holding any shard.

Each move costs real process time, so the default run is a few short sequences from a
fixed seed (5 of up to 15 steps: about 30 s on two cores, 55 s for the slowest seed
tried); `--run-slow` runs more and longer ones (40 of up to 30) from a random seed, printed;
`FUSEE_MODEL_SEED=N` repeats one (the timing of the processes is not repeated: a failure
that depends on it may take a few runs). FUSEE_MODEL_INVOKE_EXAMPLES and
FUSEE_MODEL_INVOKE_STEPS override the number and length of the sequences. A failure
prints the shrunk sequence of rules and the calls it made; shrinking stops after
FUSEE_MODEL_SHRINK_S seconds (default 300).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from hypothesis import note
from hypothesis import seed as use_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, invariant, rule

from . import server_model as S
from .harness import WIDS, model_settings
from .invoke_checks import check, check_settle
from .invoke_harness import InvokeCalls

DEFAULT_EXAMPLES, DEFAULT_STEPS, DEFAULT_SEED = 5, 15, 5
SLOW_EXAMPLES, SLOW_STEPS = 40, 30
EXAMPLES = int(os.environ.get("FUSEE_MODEL_INVOKE_EXAMPLES", 0))
STEPS = int(os.environ.get("FUSEE_MODEL_INVOKE_STEPS", 0))
DELAYS_MS = st.sampled_from([0, 0, 1, 5, 20, 100])
OVERRUN_DELAYS_MS = st.sampled_from([0, 500, 1_000, 1_300, 1_400])  # into the gated step (budget 1.5 s)
TOTALS: dict[str, float] = {}


class Recorded(InvokeCalls, S.Recorded):
    """The server mode's `Recorded` (a failure remembered for the report, candidates
    passed without running once shrinking ran out of time) over the invoked cluster."""


class InvokeModel(S.ServerModel):
    """The server mode's rules, its moves replaced by the invoked mode's."""

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        self.h = Recorded()
        self.h.note = note
        self.stops = 0

    def teardown(self) -> None:
        h: Any = self.h
        for key, value in (("excused", h.excused), ("quiet", h.quiet_checks)):
            TOTALS[key] = TOTALS.get(key, 0) + value
        if h.cluster is not None:
            TOTALS["budget_ends"] = TOTALS.get("budget_ends", 0) + h.cluster.budget_ends()
            TOTALS["kills"] = TOTALS.get("kills", 0) + sum(1 for _ in h.cluster.gone)
        super().teardown()

    def invoked(self) -> InvokeCalls:
        assert isinstance(self.h, InvokeCalls)
        return self.h

    @invariant()
    def guarantees_hold(self) -> None:
        if self.h.cluster is not None and not self.h.skip:
            self._checked(check)  # type: ignore[arg-type]

    # -- the server mode's moves that have no counterpart here ---------------------------

    kill_worker = None  # type: ignore[assignment]
    stop_holder = None  # type: ignore[assignment]
    exit_during = None  # type: ignore[assignment]  (an invocation's budget end is its clean exit)

    # -- time and the moves ----------------------------------------------------------------

    @rule()
    def settle(self) -> None:
        """Time passes, the runs settle, and then the server goes quiet: no shard held."""
        self._checked(check_settle)  # type: ignore[arg-type]

    @rule()
    def kill_handler(self) -> None:
        self.h.run(self.invoked().kill_handler())

    @rule(op=S.OPS, wid=WIDS, plan=S.PLANS, delay_ms=DELAYS_MS, server=st.booleans())
    def kill_during(self, op: str, wid: str, plan: list[str], delay_ms: int, server: bool) -> None:
        self.h.run(self.invoked().during(self.op(op, wid, plan), delay_ms, "server" if server else "handler"))

    @rule(
        wid=WIDS,
        plan=S.PLANS,
        op=S.OPS,
        other=st.one_of(st.none(), WIDS),
        delay_ms=OVERRUN_DELAYS_MS,
        reopen=st.booleans(),
    )
    def overrun(
        self, wid: str, plan: list[str], op: str, other: str | None, delay_ms: int, reopen: bool
    ) -> None:
        call = self.op(op, other or wid, plan)  # (None: a call to the gated run's own ID)
        self.h.run(self.invoked().overrun(wid, plan, call, delay_ms, reopen))


def run_invoke_model(examples: int, steps: int, seed: int) -> None:
    test = get_state_machine_test(
        InvokeModel,
        settings=model_settings(examples, steps),
    )
    print(f"model[invoke]: seed {seed} (repeat: FUSEE_MODEL_SEED={seed})", flush=True)
    started = time.monotonic()
    for shared in (S.TOTALS, S.FAILED_AT, S.SMALLEST, TOTALS):
        shared.clear()
    try:
        use_seed(seed)(test)()
    except BaseException as error:
        error.add_note(f"model test through invoked workers: seed {seed} (repeat: FUSEE_MODEL_SEED={seed})")
        if S.SMALLEST and "Flaky" in type(error).__name__:  # (else the report has the sequence)
            error.add_note(
                f"the shortest failing sequence ({S.SMALLEST[1]}) made these calls:\n{S.SMALLEST[0]}"
            )
        raise
    finally:
        print(
            f"model[invoke]: {examples} sequences of {steps} steps from seed {seed} in "
            f"{time.monotonic() - started:.1f} s ({int(S.TOTALS.get('sequences', 0))} run, "
            f"{int(S.TOTALS.get('moves', 0))} moves: {int(TOTALS.get('kills', 0))} processes killed, "
            f"{int(TOTALS.get('budget_ends', 0))} budgets ended, {int(TOTALS.get('excused', 0))} calls "
            f"unanswered at a budget's end, {int(TOTALS.get('quiet', 0))} quiet checks)"
        )


def _seed(slow: bool) -> int:
    if "FUSEE_MODEL_SEED" in os.environ:
        return int(os.environ["FUSEE_MODEL_SEED"])
    return random.randrange(1 << 32) if slow else DEFAULT_SEED


@pytest.mark.timeout(600)
def test_invoke_model() -> None:
    run_invoke_model(EXAMPLES or DEFAULT_EXAMPLES, STEPS or DEFAULT_STEPS, _seed(slow=False))


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_invoke_model_long() -> None:
    run_invoke_model(EXAMPLES or SLOW_EXAMPLES, STEPS or SLOW_STEPS, _seed(slow=True))
