"""The model test's driver: one TestEngine on a loop of its own, opened, crashed and
reopened, and what the checks read of it. The calls the state machine makes and the
obligations they leave are `calls.py`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import fusee
from fusee import journal as R
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine
from fusee.testing.faults import Faults, FaultyStorage
from fusee.workflow.ops import StepOp, StepState

from .known import AVOID
from .workflows import CODE, LEDGER

CALL_TIMEOUT_S = 2.0  # real time: every call the model makes answers well within it
SHARDS = 4
IDS = ("a", "b", "c", "d", "e")  # shards 3, 1, 3, 0, 2 of 4
WIDS = st.sampled_from(IDS)
POLICIES = st.fixed_dictionaries(
    {},
    optional={
        "running": st.sampled_from(["fail", "use-existing", "terminate-existing"]),
        "finished": st.sampled_from(["allow", "allow-if-failed", "refuse", "use-existing"]),
    },
)
UPDATES = st.sampled_from(["ok", "ok", "step", "raise", "false", "str", "type"])

# The "faulty" mode's faults (fusee/testing/faults.py): durable positions late (a few loop
# turns, now and then a real sleep) and in bursts, slow reads, and now and then a fault that
# stops a shard (a failed flush, a refused run-store frame, a lost lease), rare enough that
# most rules meet none. A stopped shard's calls fail (IoError, LeaseLostError) and are not
# acknowledged; the process then restarts (`Harness.recover`) and the checks run.
FAULTS = Faults(
    delay=0.35,
    max_turns=4,
    sleep_share=0.0,  # (real sleeps would make a failure flaky to shrink; tests/test_faults.py has them)
    max_delay_s=0.001,
    burst=0.3,
    slow_read=0.2,
    fail_flush=0.01,
    refuse_put_run=0.02,
    revoke=0.008,
)
STOPPED = (fusee.IoError, fusee.LeaseLostError)
FAULT_TOTALS: Counter[str] = Counter()  # what the faulty mode injected, over every sequence


class Violation(AssertionError):
    """A guarantee the engine broke; the message names it and what was seen."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant


async def answer_of(
    log: Callable[[str], None],
    line: str,
    answer: Awaitable[Any],
    timeout_s: float | None,
    promising_nothing: tuple[type[BaseException], ...] = (),
    excuse: Callable[[BaseException], Awaitable[tuple[str, Any]]] | None = None,
) -> tuple[str, Any]:
    """What every model's `call` makes of a call's answer: ("ok", value) or ("err", a
    FuseeError). An error of `promising_nothing` goes to `excuse` (the mode's judgment of
    an error that promises nothing: "lost", or a Violation; without `excuse` it goes on
    up); a call that does not answer within `timeout_s` breaks no-hang, and any other
    exception documented-errors (invariant 8)."""
    try:
        value = await asyncio.wait_for(answer, timeout_s)
    except promising_nothing as error:
        if excuse is None:
            raise
        return await excuse(error)
    except fusee.FuseeError as error:
        log(f"#   -> {type(error).__name__}: {error}")
        return "err", error
    except TimeoutError:
        raise Violation("no-hang", f"`{line}` did not answer within {timeout_s} s") from None
    except Exception as error:
        raise Violation("documented-errors", f"`{line}` raised {type(error).__name__}: {error}") from error
    log(f"#   -> {value!r}")
    return "ok", value


@dataclass
class Obligations:
    """What the engine's answers promised."""

    min_run: dict[str, int] = field(default_factory=dict)  # a start returned: run >= n exists
    signals: list[tuple[str, int, bytes]] = field(default_factory=list)  # acked into (wid, run)
    bad_signals: list[tuple[str, bytes]] = field(default_factory=list)  # refused: never recorded
    updates: dict[str, tuple[str, int, tuple[str, Any]]] = field(default_factory=dict)
    # acknowledged signals sent with an ID: ID -> (wid, run, payload), sent again by a move
    signal_ids: dict[str, tuple[str, int, bytes]] = field(default_factory=dict)
    refused_updates: list[tuple[str, int, str]] = field(default_factory=list)
    cancels: set[tuple[str, int]] = field(default_factory=set)
    terminates: set[tuple[str, int]] = field(default_factory=set)
    completions: list[tuple[str, int, int]] = field(default_factory=list)
    ended: list[tuple[str, int, str]] = field(default_factory=list)  # refused as ended: stays ended
    existed: list[tuple[str, int]] = field(default_factory=list)  # refused as existing


@dataclass
class Waiter:
    """A caller waiting on a run (a `result()` asked and not yet answered), across the
    steps that follow: the checks hold the engine to answering it once the run ended."""

    wid: str
    run: int | None  # the run of `wid` when it was asked (None: there was none)
    epoch: int  # LEDGER.epoch: the engine it was asked of
    line: str
    task: asyncio.Future[tuple[str, Any]]
    checked: bool = False  # its answer was checked


class Harness:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.loop_errors: list[str] = []
        self.dir: Path | None = None
        self.code = "right"
        self.absent_once = False  # the timed type's code was absent at some point
        self.lines: list[str] = []
        self.o = Obligations()
        self.counter = itertools.count(1)
        self.observed: dict[tuple[str, int], list[bytes]] = {}  # journals as seen (durable)
        self.first_seen: dict[tuple[str, int], int] = {}  # (step key, attempt) -> epoch
        self.parents: dict[tuple[str, int], list[tuple[str, str]]] = {}  # children and close policy
        self.t: TestEngine
        self.note: Callable[[str], None] = lambda line: None
        self.faulty: FaultyStorage | None = None
        self.restarts = 0  # after a fault stopped a shard
        self.waiters: list[Waiter] = []
        self.limit_defined = False  # the flow-control moves defined the limit (features.py)
        LEDGER.reset()

    # -- the loop and the engine ---------------------------------------------------------

    def run(self, coro: Awaitable[Any]) -> Any:
        if self.faulty is None:
            return self.loop.run_until_complete(coro)
        # Faulty storage: a shard stopped under the rule (a call of it failed, or the
        # oracle's read found it stopped): the rest of the rule promises nothing, and the
        # process restarts before anything else.
        result = None
        try:
            result = self.loop.run_until_complete(coro)
        except STOPPED as error:
            if not self.faulty.failed:
                raise Violation(
                    "documented-errors", f"{type(error).__name__} with no storage fault injected: {error}"
                ) from error
            self.log(f"#   -> {type(error).__name__}: {error}  (not acknowledged)")
        self.loop.run_until_complete(self.recover(quick=True))  # (the checks settle, then recover)
        return result

    @contextlib.contextmanager
    def calm(self) -> Iterator[None]:
        """Faulty storage: no fault that stops a shard while inside (the oracle reads; a
        reopening, whose restarted engine the checks then hold to the promises). Known
        defect (relay-during-recovery): a message relayed to a shard while its recovery
        awaits a read is applied before the shard's runs are read back; no slow reads then."""
        if self.faulty is None:
            yield
            return
        faults = self.faulty.faults
        if "relay-during-recovery" in AVOID:
            self.faulty.faults = replace(faults, slow_read=0.0)
        try:
            with self.faulty.suspended():
                yield
        finally:
            self.faulty.faults = faults

    async def recover(self, quick: bool = False) -> bool:
        """Faulty storage: once the storage told a shard it failed (a failed flush, a refused
        frame, a lost lease), the shard must have stopped; the process restarts (a new engine
        on the same storage, as after a disk error or a new lease holder) and the checks
        hold it to what was acknowledged before. True if it restarted."""
        if self.faulty is None:
            return False
        restarted = False
        while True:
            if self.faulty.failed or not quick:
                await self.t.settle()  # (an error a store decided may be on its way)
            failed = self.faulty.clear_failed()
            if not failed:
                return restarted
            held = {shard.index for shard in self.t.engine.shards}
            if not self.t.engine.closed and held & set(failed):
                raise Violation(
                    "documented-errors",
                    f"shards {sorted(held & set(failed))} were told their storage failed and did not stop",
                )
            why = "; ".join(f"shard {index}: {error}" for index, error in sorted(failed.items()))
            self.log(f"# storage fault ({why}): the process restarts")
            self.restarts += 1
            restarted = True
            await self.crash(settle=True)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if "stopped-receive-task" in AVOID and isinstance(exc, STOPPED) and self.faulty is not None:
            return  # known: a task the engine spawned ends with its stopped shard's error
        self.loop_errors.append(f"{context.get('message')}: {exc!r}")

    async def open(self, fault_seed: int = 0) -> None:
        LEDGER.valve = asyncio.Event()
        options: dict[str, Any] = {"shards": SHARDS}
        if self.mode in ("local", "faulty") and not os.environ.get("FUSEE_MODEL_PLAIN"):
            # Payloads sealed in storage (docs/engine.md, *Payload encryption*): every
            # recovery, load and relay of these sequences opens what they stored.
            options["codec"] = CODEC
        if self.mode == "flush_on_turn":
            options["flush_on_turn"] = True
        elif self.mode == "local":
            self.dir = Path(tempfile.mkdtemp(prefix="fusee-model-"))
            options["dir"] = self.dir / "data"
        elif self.mode == "faulty":
            self.faulty = FaultyStorage(MemoryStorage(SHARDS, instant=False), FAULTS, seed=fault_seed)
            with self.faulty.suspended():
                self.t = await TestEngine.open(workflows=CODE[self.code], storage=self.faulty, **options)
            self.log(
                f"t = await TestEngine.open(workflows=CODE[{self.code!r}], {_kw(options)}, storage=FaultyStorage("
                f"MemoryStorage({SHARDS}, instant=False), FAULTS, seed={fault_seed}))"
            )
            return
        self.t = await TestEngine.open(workflows=CODE[self.code], **options)
        self.log(f"t = await TestEngine.open(workflows=CODE[{self.code!r}], {_kw(options)})")

    def close(self) -> None:
        """Close the engine and the loop; a coroutine the engine made and never ran (found
        when the collector drops it) breaks invariant 8 too."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if self.faulty is not None:
                    FAULT_TOTALS.update(self.faulty.injected)
                    FAULT_TOTALS["restarts"] += self.restarts
                    FAULT_TOTALS["sequences"] += 1
                    if hasattr(self, "t"):
                        self._close_faulty()
                elif not self.t.engine.closed:
                    self.run(self.t.close())
            finally:
                waiting = [waiter.task for waiter in self.waiters]
                for task in waiting:
                    task.cancel()  # (its engine closed: it has its answer, or waits no more)
                if waiting:
                    self.loop.run_until_complete(asyncio.wait(waiting))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()
                if self.dir is not None:
                    shutil.rmtree(self.dir, ignore_errors=True)
                gc.collect()
                # What lives on (hypothesis's own state) is not scanned again by the next
                # sequence's collection; run_model unfreezes it at the end.
                gc.freeze()
        unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
        if "unawaited-step" in AVOID:  # known: a step task cancelled before it started
            unawaited = [m for m in unawaited if "'_main'" in m or "run_handler" in m]
        if unawaited:
            raise Violation("documented-errors", f"the engine left coroutines it never ran: {unawaited[:3]}")

    def _close_faulty(self) -> None:
        assert self.faulty is not None
        with self.faulty.suspended():
            self.loop.run_until_complete(self.recover())
            if not self.t.engine.closed:
                try:
                    self.loop.run_until_complete(self.t.close())
                except STOPPED:
                    pass  # a fault decided before the close (a lease already revoked)

    def log(self, line: str) -> None:
        self.lines.append(line)
        self.note(line)

    def program(self) -> str:
        return "\n".join(self.lines)

    # -- reading the engine's state (the oracle's view, not an API call) -------------------

    def peek(self, wid: str) -> tuple[int, str] | None:
        """The run of `wid` as the engine holds it now (in memory, durable or not)."""
        shard = self.t.engine.shard_of(wid)
        run = shard.runs.get(wid)
        if run is not None:
            return run.run_no, run.status
        entry = shard.index_entries.get(wid)
        if entry is None:
            return None
        return entry.run_no, "running" if entry.status == "parked" else entry.status

    async def journal(self, wid: str) -> tuple[int, str, list[R.Rec]] | None:
        """The current run's journal without loading a parked run."""
        shard = self.t.engine.shard_of(wid)
        run = shard.runs.get(wid)
        if run is not None:
            return run.run_no, run.status, list(run.journal)
        stored = await shard.finished_run(wid)
        if stored is None:
            return None
        return stored.run_no, "running" if stored.status == "parked" else stored.status, stored.journal

    def memory_journal(self, wid: str) -> tuple[int, list[R.Rec]] | None:
        run = self.t.engine.shard_of(wid).runs.get(wid)
        return (run.run_no, run.journal) if run is not None else None

    def busy_steps(self) -> list[str]:
        """Step functions running (or gated) that are not waiting for the valve."""
        out = []
        for shard in self.t.engine.shards:
            for run in shard.runs.values():
                for op in run.ops.values():
                    if (
                        isinstance(op, StepOp)
                        and op.state is StepState.RUNNING
                        and not op.done
                        and not _gated(op)
                        and not _waiting_permit(op)
                        and not run.final
                    ):
                        out.append(f"{run.wid}/{op.name}")
        return out

    def check_busy_shards(self) -> None:
        """Invariant 6 between turns: a shard with a run loading, a run ready to drive or
        records not yet durable can progress, so it is not idle."""
        for shard in self.t.engine.shards:
            busy = bool(shard.loading) or bool(shard.ready) or shard.appended > shard.durable
            if busy and shard.idle():
                what = (
                    "a run loading"
                    if shard.loading
                    else "a run ready"
                    if shard.ready
                    else "records unflushed"
                )
                raise Violation("idle", f"shard {shard.index}: idle() is True with {what}")

    def finished_step_tasks(self) -> bool:
        return any(
            isinstance(op, StepOp) and op.task is not None and op.task.done()
            for shard in self.t.engine.shards
            for run in shard.runs.values()
            for op in run.ops.values()
        )

    def gates_open(self, shard_index: int) -> bool:
        shard = self.t.engine.by_index[shard_index]
        return any(
            isinstance(op, StepOp) and op.state is StepState.RUNNING and not op.done and _gated(op)
            for run in shard.runs.values()
            if not run.final
            for op in run.ops.values()
        )

    def permits_waiting(self, shard_index: int) -> bool:
        """A step of the shard waits for a limit's permit: the shard is not idle (its run is
        in flight; docs/limits.md, *Not built yet*: such a wait still holds the shard)."""
        shard = self.t.engine.by_index[shard_index]
        return any(
            isinstance(op, StepOp) and op.state is StepState.RUNNING and not op.done and _waiting_permit(op)
            for run in shard.runs.values()
            if not run.final
            for op in run.ops.values()
        )

    async def quiesce(self) -> None:
        """Settle, and wait (real time) for step functions on threads."""
        deadline = time.monotonic() + 3.0
        while True:
            await self.t.settle()
            busy = self.busy_steps()
            if not busy:
                return
            if time.monotonic() > deadline:
                raise Violation("progress", f"step functions never finished: {busy}")
            await asyncio.sleep(0.001)

    # -- calls ----------------------------------------------------------------------------

    async def call(self, line: str, make: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
        """Make one API call: ("ok", value) or ("err", a FuseeError). Any other exception,
        or a call that does not answer, breaks invariant 8."""
        self.log(line)
        if self.faulty is not None and "update-stop-hang" in AVOID and ".update" in line:
            answer, timeout_s = self._update_answer_or_stop(make()), None  # its own deadline
        else:
            answer, timeout_s = make(), CALL_TIMEOUT_S
        # A shard stopped under a storage fault goes on up (see `run`); with no fault it
        # is a refusal like any other.
        stopped = STOPPED if self.faulty is not None else ()
        return await answer_of(self.log, line, answer, timeout_s, stopped)

    async def _update_answer_or_stop(self, call: Awaitable[Any]) -> Any:
        """Known defect (update-stop-hang): an update under way when its shard stops never
        answers; once a shard was told of a storage failure, the call counts as refused."""
        assert self.faulty is not None
        task = asyncio.ensure_future(call)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            done, _ = await asyncio.wait({task}, timeout=0.005)
            if done:
                return task.result()
            if self.faulty.failed:
                task.cancel()
                raise fusee.IoError("a shard stopped under the update (known: update-stop-hang)")
        task.cancel()
        raise TimeoutError


def _gated(op: StepOp) -> bool:
    return op.fn.__qualname__.startswith("_gated")


def _waiting_permit(op: StepOp) -> bool:
    """A step waiting for its limit's permit: its function has not begun (the permit comes
    when the limit is defined, a permit is returned, or the rate's time comes)."""
    return op.limit is not None and op.permit is None and op.task is None


CODEC = fusee.aes_gcm({"model": b"\x07" * 32})


def _kw(options: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={str(v)!r}" if isinstance(v, Path) else "codec=CODEC" if k == "codec" else f"{k}={v!r}"
        for k, v in options.items()
    )


def model_settings(examples: int, steps: int, explain: bool = False) -> Any:
    """The hypothesis settings of every model-based test: no database (a seed repeats a
    run), no deadline (moves take real process time), one bug reported, shrinking on."""
    phases = [Phase.generate, Phase.shrink, *([Phase.explain] if explain else [])]
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )
