"""The model test's driver: one TestEngine on a loop of its own, the API calls the state
machine makes (each logged as the Python line that makes it), and the obligations each
answer leaves: what an acknowledgment or a refusal promised, for the checks to hold the
engine to after every step, across crashes and reopenings."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import fusee
from fusee import journal as R
from fusee.engine.engine import parse_token
from fusee.engine.index import BUCKET_MS
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine
from fusee.testing.faults import Faults, FaultyStorage
from fusee.workflow.ops import StepOp, StepState

from .journal import live_due, read
from .known import AVOID
from .workflows import BUMP, BUMP_STEP, CODE, GO, LEDGER, PLAN_TYPE, PROGRESS, TIMED_TYPE, Plan

CALL_TIMEOUT_S = 2.0  # real time: every call the model makes answers well within it
SHARDS = 4
IDS = ("a", "b", "c", "d", "e")  # shards 3, 1, 3, 0, 2 of 4

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


@dataclass
class Obligations:
    """What the engine's answers promised."""

    min_run: dict[str, int] = field(default_factory=dict)  # a start returned: run >= n exists
    signals: list[tuple[str, int, bytes]] = field(default_factory=list)  # acked into (wid, run)
    bad_signals: list[tuple[str, bytes]] = field(default_factory=list)  # refused: never recorded
    updates: dict[str, tuple[str, int, tuple[str, Any]]] = field(default_factory=dict)
    refused_updates: list[tuple[str, int, str]] = field(default_factory=list)
    cancels: set[tuple[str, int]] = field(default_factory=set)
    terminates: set[tuple[str, int]] = field(default_factory=set)
    completions: list[tuple[str, int, int]] = field(default_factory=list)
    ended: list[tuple[str, int, str]] = field(default_factory=list)  # refused as ended: stays ended
    existed: list[tuple[str, int]] = field(default_factory=list)  # refused as existing


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
        try:
            if self.faulty is not None and "update-stop-hang" in AVOID and ".update" in line:
                value = await self._update_answer_or_stop(make())
            else:
                value = await asyncio.wait_for(make(), CALL_TIMEOUT_S)
        except STOPPED as error:
            if self.faulty is None:
                self.log(f"#   -> {type(error).__name__}: {error}")
                return "err", error
            raise  # a shard stopped under a storage fault: see `run`
        except fusee.FuseeError as error:
            self.log(f"#   -> {type(error).__name__}: {error}")
            return "err", error
        except TimeoutError:
            raise Violation("no-hang", f"`{line}` did not answer within {CALL_TIMEOUT_S} s") from None
        except Exception as error:
            raise Violation(
                "documented-errors", f"`{line}` raised {type(error).__name__}: {error}"
            ) from error
        self.log(f"#   -> {value!r}")
        return "ok", value

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

    def unique(self) -> int:
        return 1_000_000 + next(self.counter)

    def wf_name(self, timed: bool) -> str:
        return TIMED_TYPE if timed else PLAN_TYPE

    def code_for(self, type_: str) -> str:
        """'right', 'changed' or 'absent': the code the engine has for a type now."""
        if self.code == "absent" and type_ == TIMED_TYPE:
            return "absent"
        return self.code

    async def stuck(self, wid: str, held: tuple[int, str] | None, defect: str) -> bool:
        """Whether to step around a call to a stuck run (or one that sticks once loaded),
        or to a run without code (known defects)."""
        if held is None:
            return False
        if held[1] == "waiting_for_code" and "calls-waiting-for-code" in AVOID:
            return True
        if defect not in AVOID:
            return False
        if held[1] == "stuck":
            return True
        journal = await self.journal(wid)
        prefix = {"right": "s", "changed": "x", "absent": "s"}[self.code]
        return journal is not None and bool(read(journal[2]).prefixes - {prefix})

    def deadline_plan(self, plan: list[str], deadline: bool) -> list[str]:
        """Known defects: a run with a deadline loses it after a child or continue-as-new."""
        if deadline and "deadline-child" in AVOID:
            plan = [item for item in plan if not item.startswith("child:")]
        if deadline and "deadline-cas" in AVOID:
            plan = [item for item in plan if item != "cas"]
        return plan

    # -- operations -------------------------------------------------------------------------

    async def start(
        self, wid: str, plan: list[str], policy: dict[str, str], timed: bool, timeout: int | None
    ) -> None:
        plan = self.deadline_plan(plan, timed or bool(timeout))
        before = self.peek(wid)
        type_ = self.wf_name(timed)
        extra = f", timeout={timeout}" if timeout else ""
        kind, value = await self.call(
            f"await t.engine.start({type_!r}, {wid!r}, Plan({plan!r}), id_policy={policy!r}{extra})",
            lambda: self.t.engine.start(type_, wid, Plan(plan), id_policy=policy, timeout=timeout),
        )
        after = self.peek(wid)
        if kind == "ok":
            self._acked_start(wid, after, f"start of '{wid}'")
            self._check_policy(wid, policy, before, after)
        elif isinstance(value, fusee.AlreadyExistsError):
            self._refused_as_existing(wid, policy, before)
        elif isinstance(value, fusee.UnknownWorkflowError):
            if self.code_for(type_) != "absent":
                raise Violation(
                    "documented-errors", f"start refused a type whose code is registered: {value}"
                )
        else:
            raise Violation("refusals", f"start of '{wid}' refused: {type(value).__name__}: {value}")

    def _acked_start(self, wid: str, after: tuple[int, str] | None, what: str) -> None:
        if after is None:
            raise Violation("acknowledged", f"{what} returned but the engine holds no run of '{wid}'")
        self.o.min_run[wid] = max(self.o.min_run.get(wid, 0), after[0])

    def _check_policy(
        self, wid: str, policy: dict[str, str], before: tuple[int, str] | None, after: tuple[int, str] | None
    ) -> None:
        assert after is not None
        if before is None:
            return
        running = before[1] not in ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")
        rule = policy.get("running" if running else "finished", "fail" if running else "allow")
        # (a run may continue as new before the answer arrives: run numbers only grow)
        if rule in ("terminate-existing", "allow", "allow-if-failed") and after[0] <= before[0]:
            raise Violation("id-policy", f"{rule} on run {before} left run {after} (expected a new run)")
        if rule in ("fail", "refuse"):
            raise Violation("id-policy", f"{rule} on run {before} acknowledged a start (run {after})")

    def _refused_as_existing(self, wid: str, policy: dict[str, str], before: tuple[int, str] | None) -> None:
        if before is None:
            raise Violation("refusals", f"start of '{wid}' refused AlreadyExists, but no run of it exists")
        self.o.existed.append((wid, before[0]))
        final = before[1] in ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")
        if final:
            self.o.ended.append((wid, before[0], "a start refused as already finished"))
        rule = policy.get("finished" if final else "running", "allow" if final else "fail")
        if rule in ("use-existing", "terminate-existing", "allow") or (
            rule == "allow-if-failed" and before[1] != "ok"
        ):
            raise Violation("id-policy", f"start of '{wid}' refused although {rule} allows it (run {before})")

    async def signal(self, wid: str, good: bool) -> None:
        value: Any = self.unique() if good else f"bad-{self.unique()}"
        before = self.peek(wid)
        if await self.stuck(wid, before, "signal-stuck"):
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).signal(GO, {value!r})",
            lambda: self.t.engine.run(wid).signal(GO, value),
        )
        payload = fusee._codec.encode(value)
        if kind == "ok":
            if not good:
                raise Violation("typed-calls", f"a signal of the wrong type to '{wid}' was acknowledged")
            await self._acked_signal(wid, before, payload, f"signal {value!r} to '{wid}'")
        elif not good and isinstance(result, fusee.CodecError):
            self.o.bad_signals.append((wid, payload))
        else:
            self._refused_running(wid, before, result, f"signal to '{wid}'")

    async def _acked_signal(
        self, wid: str, before: tuple[int, str] | None, payload: bytes, what: str
    ) -> None:
        found = await self._find_now(
            wid, lambda rec: isinstance(rec, R.SignalReceived) and rec.value == payload
        )
        if found is not None:
            self.o.signals.append((wid, found, payload))
        elif before is not None and self.peek(wid) is not None and self.peek(wid)[0] == before[0]:  # type: ignore[index]
            raise Violation("acknowledged", f"{what} returned but the run's journal has no SignalReceived")

    async def _find_now(self, wid: str, match: Callable[[R.Rec], bool]) -> int | None:
        """The number of the current run of `wid` if its journal holds a record that
        matches (read right after an acknowledgment, before anything else runs)."""
        held = await self.journal(wid)
        if held is not None and any(match(rec) for rec in held[2]):
            return held[0]
        return None

    def _refused_running(self, wid: str, before: tuple[int, str] | None, error: Any, what: str) -> None:
        """A call refused with NotFound must be about a run that ended (or none)."""
        if isinstance(error, fusee.NotFoundError):
            if before is not None and before[1] in ("running", "stuck", "waiting_for_code"):
                raise Violation("refusals", f"{what} refused NotFound while run {before} is not final")
            if before is not None:
                self.o.ended.append((wid, before[0], what))
            return
        now = before or self.peek(wid)
        if isinstance(error, fusee.RejectedError) and now is not None:
            if now[1] == "running" and "no handler" in str(error):
                raise Violation(
                    "handlers", f"{what} refused: {error} (the run registers its handlers before it awaits)"
                )
            return
        raise Violation("refusals", f"{what} refused with {type(error).__name__}: {error}")

    async def query(self, wid: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "-"):
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).query(PROGRESS)", lambda: self.t.engine.run(wid).query(PROGRESS)
        )
        if kind == "err":
            if isinstance(result, fusee.RejectedError) and "has ended" in str(result):
                if before is not None and before[1] in ("running", "stuck"):
                    raise Violation("refusals", f"query refused as ended while run {before} runs")
                return
            self._refused_running(wid, before, result, f"query of '{wid}'")

    async def update(self, wid: str, mode: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "update-stuck"):
            return
        uid = f"u{self.unique()}"
        arg: Any = {"ok": 2, "step": 3, "boom": 99, "raise": -1, "false": 13, "str": 0, "type": "three"}[mode]
        definition, name = (BUMP_STEP, "BUMP_STEP") if mode == "step" else (BUMP, "BUMP")
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).update({name}, {arg!r}, id={uid!r})",
            lambda: self.t.engine.run(wid).update(definition, arg, id=uid),
        )
        await self._update_answer(wid, before, uid, mode, kind, result)

    async def _update_answer(
        self, wid: str, before: tuple[int, str] | None, uid: str, mode: str, kind: str, result: Any
    ) -> None:
        valid = mode in ("ok", "step", "boom")
        if mode == "boom" and kind == "err" and isinstance(result, fusee.WorkflowError):
            kind, result = (
                "ok",
                ("raised", type(result).__name__, str(result)),
            )  # the handler's failure, recorded
        if kind == "ok":
            if not valid:
                raise Violation("refusals", f"update {uid} ({mode}) to '{wid}' was accepted: {result!r}")
            run = await self._find_now(wid, lambda rec: isinstance(rec, R.UpdateDone) and rec.id == uid)
            if run is None:
                now = self.peek(wid)
                if before is not None and now is not None and now[0] == before[0]:
                    raise Violation("acknowledged", f"update {uid} returned but its run has no UpdateDone")
                run = before[0] if before else 0
            self.o.updates[uid] = (wid, run, ("ok", result))
            return
        error = result
        if mode == "type":
            if not isinstance(error, fusee.CodecError):
                self._refused_running(wid, before, error, f"update {uid} of the wrong type")
            self.o.refused_updates.append((wid, before[0] if before else 0, uid))
            return
        if not valid:
            if isinstance(error, fusee.RejectedError) and "refused" in str(error):
                self.o.refused_updates.append((wid, before[0] if before else 0, uid))
                return
            self._refused_running(wid, before, error, f"update {uid} ({mode})")
            return
        if isinstance(error, fusee.RejectedError) and "ended before the update finished" in str(error):
            return
        self._refused_running(wid, before, error, f"update {uid} to '{wid}'")

    async def repeat_update(self, index: int) -> None:
        if not self.o.updates:
            return
        uid = sorted(self.o.updates)[index % len(self.o.updates)]
        wid, run, first = self.o.updates[uid]
        held = self.peek(wid)
        if await self.stuck(wid, held, "update-stuck"):
            return
        if held is not None and held[1] == "waiting_for_code" and "repeat-update-without-code" in AVOID:
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).update(BUMP, 5, id={uid!r})  # repeated",
            lambda: self.t.engine.run(wid).update(BUMP, 5, id=uid),
        )
        now = self.peek(wid)
        if now is None or now[0] != run:
            return  # another run now: update IDs are per run
        if kind == "err" and isinstance(result, fusee.WorkflowError) and isinstance(first[1], tuple):
            kind, result = "ok", ("raised", type(result).__name__, str(result))
        if kind == "ok" and first != ("ok", result):
            raise Violation("acknowledged", f"update {uid} repeated gave {result!r}, first {first[1]!r}")
        if kind == "err":
            raise Violation(
                "acknowledged",
                f"update {uid} repeated on run {run} refused: {type(result).__name__}: {result}",
            )

    async def signal_with_start(self, wid: str, plan: list[str], timed: bool) -> None:
        plan = self.deadline_plan(plan, timed)
        value = self.unique()
        before = self.peek(wid)
        if await self.stuck(wid, before, "signal-stuck"):
            return
        type_ = self.wf_name(timed)
        kind, result = await self.call(
            f"await t.engine.signal_with_start({type_!r}, {wid!r}, Plan({plan!r}), GO, {value})",
            lambda: self.t.engine.signal_with_start(type_, wid, Plan(plan), GO, value),
        )
        if kind == "ok":
            self._acked_start(wid, self.peek(wid), f"signal_with_start of '{wid}'")
            await self._acked_signal(wid, before, fusee._codec.encode(value), f"signal_with_start of '{wid}'")
        elif isinstance(result, fusee.UnknownWorkflowError) and self.code_for(type_) == "absent":
            return
        else:
            self._refused_running(wid, before, result, f"signal_with_start of '{wid}'")

    async def update_with_start(self, wid: str, plan: list[str], twice: bool) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "update-stuck"):
            return
        if "update-with-start-ends" in AVOID:
            plan = ["wait", *plan]  # the run must not end before its start is durable
        uids = [f"u{self.unique()}" for _ in range(2 if twice else 1)]

        async def one(uid: str) -> tuple[str, Any]:
            return await self.call(
                f"await t.engine.update_with_start('{PLAN_TYPE}', {wid!r}, Plan({plan!r}), BUMP, 4, update_id={uid!r})",
                lambda: self.t.engine.update_with_start(PLAN_TYPE, wid, Plan(plan), BUMP, 4, update_id=uid),
            )

        if twice:
            self.log("# the two calls below run concurrently (asyncio.gather)")
        got = await asyncio.gather(*(one(uid) for uid in uids), return_exceptions=True)
        stopped = [answer for answer in got if isinstance(answer, STOPPED)]
        for answer in got:
            if isinstance(answer, BaseException) and not isinstance(answer, STOPPED):
                raise answer
        answers = [(uid, answer) for uid, answer in zip(uids, got, strict=True) if isinstance(answer, tuple)]
        for uid, (kind, result) in answers:
            if kind == "ok":
                self._acked_start(wid, self.peek(wid), f"update_with_start of '{wid}'")
                result = result[1]
            await self._update_answer(wid, before, uid, "ok", kind, result)
        if stopped:
            raise stopped[0]

    async def cancel(self, wid: str, twice: bool) -> None:
        for _ in range(2 if twice else 1):
            before = self.peek(wid)
            if await self.stuck(wid, before, "cancel-stuck"):
                return
            kind, result = await self.call(
                f"await t.engine.run({wid!r}).cancel()", lambda: self.t.engine.run(wid).cancel()
            )
            if kind == "ok":
                run = await self._find_now(wid, lambda rec: isinstance(rec, R.CancelRequested))
                if run is None:
                    raise Violation(
                        "acknowledged", f"cancel of '{wid}' returned but no CancelRequested is recorded"
                    )
                self.o.cancels.add((wid, run))
            else:
                self._refused_running(wid, before, result, f"cancel of '{wid}'")
            await self.t.settle()

    async def terminate(self, wid: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "-"):
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).terminate()", lambda: self.t.engine.run(wid).terminate()
        )
        if kind == "ok":
            held = await self.journal(wid)
            last = held[2][-1] if held and held[2] else None
            if held is None or not (isinstance(last, R.Finished) and last.status == "terminated"):
                raise Violation("acknowledged", f"terminate of '{wid}' returned; its journal ends {last!r}")
            self.o.terminates.add((wid, held[0]))
        else:
            self._refused_running(wid, before, result, f"terminate of '{wid}'")

    async def complete(self, index: int, ok: bool) -> None:
        if not LEDGER.tokens:
            return
        wid, token = LEDGER.tokens[index % len(LEDGER.tokens)]
        _, run, seq, attempt, _ = parse_token(token)
        tok = f"LEDGER.tokens[{index % len(LEDGER.tokens)}][1]"
        if ok:
            line = f"await t.engine.complete({tok}, 7)"
            make: Callable[[], Awaitable[Any]] = lambda: self.t.engine.complete(token, 7)  # noqa: E731
        else:
            line = f"await t.engine.fail({tok}, 'no')"
            make = lambda: self.t.engine.fail(token, "no")  # noqa: E731
        current = await self.journal(wid)
        kind, result = await self.call(line, make)
        if kind == "ok":
            found = await self._find_now(wid, lambda rec: isinstance(rec, R.Completed) and rec.seq == seq)
            now = self.peek(wid)
            if found != run and now is not None and now[0] == run:
                raise Violation(
                    "acknowledged", f"completion of '{wid}' position {seq} returned; not recorded"
                )
            self.o.completions.append((wid, run, seq))
            return
        if not isinstance(result, fusee.RejectedError):
            raise Violation("refusals", f"completion refused with {type(result).__name__}: {result}")
        if current is not None and current[0] == run and current[1] == "running":
            records = current[2]
            sent = any(
                isinstance(r, R.CompletionSent) and r.seq == seq and r.attempt == attempt for r in records
            )
            closed = any(
                isinstance(r, (R.Completed, R.CancelRequested))
                for r in records
                if getattr(r, "seq", seq) == seq
            )
            prefix = {"right": "s", "changed": "x", "absent": "s"}[self.code]
            sticks = bool(read(records).prefixes - {prefix}) or self.code_for(current[2][0].type) == "absent"  # type: ignore[attr-defined]
            if sent and not closed and not sticks:
                raise Violation("refusals", f"a live completion token of '{wid}' was refused: {result}")

    async def open_valve(self) -> None:
        self.log("LEDGER.valve.set()  # gated steps finish")
        valve = LEDGER.valve
        assert valve is not None
        valve.set()
        await self.quiesce()
        LEDGER.valve = asyncio.Event()
        self.log("LEDGER.valve = asyncio.Event()")

    async def advance(self, ms: int) -> None:
        self.log(f"await t.advance({ms})")
        await self.t.advance(ms)

    async def before_reopening(self) -> None:
        """Known defect (checkpoint-wakeup): a parked run whose timer's bucket has begun
        loses its wake-up across a reopening; step around it by letting that timer pass."""
        if "checkpoint-wakeup" not in AVOID:
            return
        now = self.t.now_ms()
        late = 0
        for row in [row async for row in self.t.engine.list()]:
            held = await self.journal(row.id)
            due = live_due(read(held[2])) if held is not None and held[1] == "running" else 0
            if due and due // BUCKET_MS * BUCKET_MS <= now < due:
                late = max(late, due)
        if late:
            await self.advance(late - now)

    async def crash(self, settle: bool) -> None:
        await self.before_reopening()
        while "zombie-step-result" in AVOID and self.finished_step_tasks():
            await asyncio.sleep(0)  # known: a result already computed is recorded by the dropped engine
        self.log(f"await t.crash(settle={settle})")
        LEDGER.epoch += 1
        with self.calm():
            await self.t.crash(settle=settle)

    async def restart(self, code: str, clean: bool) -> None:
        await self.before_reopening()
        if "waiting-for-code-resume" in AVOID and "absent" in (code, self.code):
            clean = False  # known: a clean reopening strands runs waiting for code
        self.code = code
        self.absent_once = self.absent_once or code == "absent"
        self.log(f"await t.restart(workflows=CODE[{code!r}], clean={clean})")
        LEDGER.epoch += 1
        if self.faulty is None:
            await self.t.restart(workflows=CODE[code], clean=clean)
            return
        # Faulty storage: the close may meet a fault (then what it had not flushed is lost,
        # as in a crash); the reopening meets none that stops a shard.
        self.t.workflows = list(CODE[code])
        if clean:
            try:
                await asyncio.wait_for(self.t.close(), CALL_TIMEOUT_S)
            except TimeoutError:
                raise Violation(
                    "no-hang", f"the engine's close did not finish within {CALL_TIMEOUT_S} s"
                ) from None
            except STOPPED as error:
                self.log(
                    f"#   -> the close failed ({type(error).__name__}: {error}): reopened as after a crash"
                )
        else:
            await self.t.settle()
            self.t.engine.abandon()
            await self.faulty.abandon()
        self.faulty.clear_failed()  # the reopening recovers every shard
        with self.calm():
            await self.t._open()
            await self.t.settle()

    async def then_crash(self, op: Callable[[], Awaitable[None]], turns: int) -> None:
        """Run an operation for `turns` turns of the loop, then crash at once: what it was
        acknowledged (it returned) holds, what it was not promises nothing."""
        task = asyncio.ensure_future(op())
        for _ in range(turns):
            await asyncio.sleep(0)
        self.log(f"# after {turns} turns:")
        self.check_busy_shards()
        done = task.done()
        await self.crash(settle=False)
        if not done:
            task.cancel()
            self.log("#   (that call had not answered: cancelled)")
        try:
            await task
        except (asyncio.CancelledError, Violation):
            if done:
                raise
        except fusee.ClosedError:
            pass
        except STOPPED:
            if self.faulty is None:
                raise  # (faulty storage: its shard stopped before the crash; not acknowledged)


def _gated(op: StepOp) -> bool:
    return op.fn.__qualname__.startswith("_gated")


def _kw(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v)!r}" if isinstance(v, Path) else f"{k}={v!r}" for k, v in options.items())
