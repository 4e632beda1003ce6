"""A shard: the runs whose workflow IDs hash to it, their timers, its outbox, and the
records it runs ahead of the disk with.

Single-threaded by construction: every method runs on the engine's event loop and none
awaits in the middle of changing state, so one shard's state is only ever touched by one
piece of code at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fusee import _errors as errors
from fusee import journal as R
from fusee._clock import Clock
from fusee._errors import (
    ClosedError,
    Failure,
    FuseeError,
    IoError,
)
from fusee._sealing import AesGcm, open_msg, seal_msg, seal_rec, sealed_frame
from fusee.engine import checkpoint as checkpoints
from fusee.engine import idle
from fusee.engine.callers import Callers
from fusee.engine.durability import Durability
from fusee.engine.idle import IdleReport
from fusee.engine.index import RunIndex, key_of, load_at
from fusee.engine.loader import RunLoader
from fusee.engine.outbox import RESEND_MS, Outbox
from fusee.engine.run import RunState, stop_step
from fusee.engine.run_life import RunLife
from fusee.engine.shard_messages import Delivery
from fusee.engine.shard_metrics import ShardMetrics
from fusee.engine.steps import Steps
from fusee.engine.timers import TICK, Timers
from fusee.journal import Ack, IndexEntry, Msg, Status
from fusee.storage import ShardStore
from fusee.workflow.definitions import Retry, Workflow
from fusee.workflow.ops import StepOp, StepState

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from fusee.engine.limits import Limits
    from fusee.engine.telemetry import Telemetry

log = logging.getLogger("fusee")
_RUNNING = Status.RUNNING  # read for every loaded run at every sweep


def _closed() -> ClosedError:
    return ClosedError("the engine is closed; open a new one")


class ShardHost(Protocol):
    """What a shard and its helpers need of the engine that holds it
    (`fusee/engine/engine.py`): its clock and settings, its routing between shards, the
    `wait_idle` watchers to wake, and the call that takes a stopped shard out of service.
    A type only, so the shard depends on no engine code."""

    @property
    def clock(self) -> Clock: ...
    @property
    def workflows(self) -> dict[str, Workflow[Any]]: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def record_stacks(self) -> bool: ...
    @property
    def default_retry(self) -> Retry: ...
    @property
    def telemetry(self) -> Telemetry | None: ...
    @property
    def step_mocks(self) -> dict[tuple[str, str], Callable[[int], Any]]: ...
    @property
    def park_after_ms(self) -> int: ...
    @property
    def retention_ms(self) -> int: ...
    @property
    def tick_ms(self) -> int: ...
    @property
    def checkpoint_records(self) -> int: ...
    @property
    def idle_waiters(self) -> int: ...
    @property
    def activity(self) -> asyncio.Event: ...
    @property
    def permits(self) -> Limits: ...
    @property
    def on_exhausted(self) -> str: ...
    @property
    def codec(self) -> AesGcm | None: ...
    @property
    def object_calls(self) -> Any: ...  # object calls from workflow code (fusee/engine/objects/)
    def step_threads(self) -> ThreadPoolExecutor: ...
    def callback_url(self, token: str) -> str | None: ...
    def route(self, msg: Msg) -> None: ...
    def route_ack(self, src: int, ack: Ack) -> None: ...
    def shard_stopped(self, shard: Shard) -> None: ...


class Shard(RunLife):
    """Its runs' start and end: `RunLife` (fusee/engine/run_life.py); loading them:
    fusee/engine/loader.py."""

    def __init__(self, engine: ShardHost, index: int) -> None:
        self.engine = engine
        self.index = index
        self.store: ShardStore  # set by the engine: the store reports to this shard's methods
        self.clock = engine.clock
        self.runs: dict[str, RunState] = {}
        self.runs_peak = 0
        self.index_entries = RunIndex()
        self.outbox = Outbox(index)
        self.messages = Delivery(self)
        self.steps = Steps(self)
        self.durability = Durability(self)
        # Bound once: what outputs and step gates wait on (no wrapper on the hot path).
        self.when_durable = self.durability.when_durable
        self.durable_at = self.durability.durable_at
        self.failed: BaseException | None = None  # the storage failure that stopped it
        self.stop_error: FuseeError | None = None  # what callers get once it stopped
        self.timers = Timers(self)
        self.ticking = False  # the sweep is scheduled
        self.loader = RunLoader(self)
        self.loading = self.loader.loading  # the same dict: what idleness and a stop read
        # Bound once, as `when_durable`: what callers, timers and recovery call.
        self.load = self.loader.load
        self.wake = self.loader.wake
        self.revive = self.loader.revive
        self.resume_type = self.loader.resume_type
        self.finished_run = self.loader.finished_run
        self.indexed = self.loader.indexed
        self.callers = Callers(self)
        # The same dicts (idleness reads the updates waited for); bound once, as above.
        self.result_waiters = self.callers.results
        self.update_waiters = self.callers.updates
        self.result_waiter = self.callers.result_waiter
        self.update_waiter = self.callers.update_waiter
        self.update_finished = self.callers.update_finished
        self.ready: set[RunState] = set()
        self.pump_scheduled = False
        self.steps_run = 0
        self.heartbeats = 0  # Heartbeat records appended (fusee/engine/heartbeats.py)
        self.counts = ShardMetrics()  # the rest of its counters: `metrics()`
        self.open_ms = 0.0  # how long attaching took: opening, then recovery
        self.calls = 0
        self.checkpoint_position = 0
        # (log position, index changes) the newest checkpoint covers: the same pair now
        # means a checkpoint would write what is already there, so none is written.
        self.checkpointed: tuple[int, int] | None = None
        self.checkpointing = False
        self.checkpoint_done: asyncio.Future[None] | None = None
        self.closed = False
        self.draining = False  # routes nothing new; answers what was routed (Engine.drain)
        # Reported or closing: a permit granted now is kept by the server for the shard's
        # next holder, not used here (the report said no step runs).
        self.leaving = False
        self.live = False  # recovered: relayed messages are applied (until then they wait)
        self.early: list[Msg | Ack] = []
        self.tasks: set[asyncio.Future[Any]] = set()  # see `spawn`
        self.types_without_code: set[str] = set()

    # -- time -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def new_seed(self) -> int:
        # The key of the run's completion tokens (engine.make_token): from the OS CSPRNG,
        # since `random`'s outputs predict its next ones and any code may seed it.
        return int.from_bytes(os.urandom(8), "big") >> 1  # 63 bits (what secrets.randbits does)

    # -- records ---------------------------------------------------------------------------

    @property
    def appended(self) -> int:
        return self.durability.appended

    @property
    def durable(self) -> int:
        return self.durability.durable

    def append(self, run: RunState, rec: R.Rec) -> int:
        """Stage a run's record. Visible at once; durable with the next flush."""
        # The hot path of every step: `Durability.stage` and the fast case of `made`, inline.
        durability = self.durability
        codec = self.engine.codec
        entry = R.encode_entry(R.Entry(run.wid, run.run_no, rec if codec is None else seal_rec(codec, rec)))
        durability.bytes += len(entry)
        durability.appending = True
        durability.appended = lsn = self.store.append(entry)
        durability.appending = False
        sent = self.outbox.note(run.wid, run.run_no, rec, run.started.parent)
        if sent is not None:
            self.messages.send_when_durable(lsn, sent if isinstance(sent, list) else [sent])
        if durability.durable >= lsn and not durability.gates and not self.engine.idle_waiters:
            return lsn  # durable on append, nothing waiting, nobody watching: nothing to do
        durability.made(lsn)
        return lsn

    def append_shard(self, rec: R.Rec) -> int:
        durability = self.durability
        lsn = durability.stage(R.encode_entry(R.Entry("", 0, rec)))
        self.outbox.note("", 0, rec, None)
        durability.made(lsn)
        return lsn

    def on_relayed(self, item: Msg | Ack) -> None:
        """The store's relay: a message or acknowledgment from a shard another engine
        holds (or held, before this one attached)."""
        if self.closed:
            return  # the sender resends what is not acknowledged
        if not self.live:
            # Recovery has not read the log yet: applied now, a message would find no run
            # (and its Received record would move the position recovery reads from).
            self.early.append(item)
            return
        if isinstance(item, Msg):
            codec = self.engine.codec
            self.spawn(self.messages.receive(item if codec is None else open_msg(codec, item)))
        else:
            self.spawn(self.messages.acked(item))

    def check(self) -> None:
        """Refuse work on a shard that stopped (a failed write, a lost lease, a detach)."""
        if self.stop_error is not None:
            raise self.stop_error

    def stopped_error(self) -> FuseeError:
        return self.stop_error or _closed()

    def fail(self, exc: BaseException, why: str = "stopped after a failed flush") -> None:
        """Stop the shard after a failure of its storage or of the engine itself."""
        self.failed = exc
        self.stop(
            IoError(
                f"shard {self.index} {why} ({exc}); nothing more is acknowledged for its "
                "workflows: restart the process (what was acknowledged is recovered)"
            )
        )

    def stop(self, error: FuseeError) -> None:
        """Stop the shard at once: nothing more is recorded or acknowledged (the kernel may
        have dropped the pages of a failed write; another holder may own the shard now),
        every caller waiting on it gets `error`, and it leaves the engine, so it holds no
        timers and counts as neither busy nor idle. What was acknowledged stays: the
        shard's next holder recovers it."""
        if self.stop_error is not None:
            return
        self.stop_error = error
        self.abandon()  # every caller waiting on the shard gets `error`
        self.durability.gates.clear()
        self.engine.shard_stopped(self)
        self.poke()

    # -- scheduling runs -------------------------------------------------------------------

    def schedule(self, run: RunState) -> None:
        self.ready.add(run)
        if not self.pump_scheduled:
            self.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self.pump_scheduled = False
        ready, self.ready = self.ready, set()
        for run in ready:
            # A run that left memory since it was scheduled (parked, replaced, or its shard
            # closed) is not driven: its coroutines are closed.
            if not self.closed and self.runs.get(run.wid) is run:
                run.drive()
            else:
                run.close_fibers()  # let go of before its turn: never to run

    def turn(self, run: RunState) -> None:
        """Give a scheduled run its turn now: a call (a query, an update) must see the run
        as its code leaves it after running until it blocks, not before its first turn."""
        if run in self.ready:
            self.ready.discard(run)
            if not self.closed:
                run.drive()

    # -- timers (fusee/engine/timers.py) and the sweep --------------------------------------

    def timer_due(self, run: RunState, seq: int) -> None:
        """A loaded run's timer came due."""
        del run.timers[seq]
        if seq == -1:
            run.end(
                R.Finished(
                    Status.TIMED_OUT, failure=Failure("the workflow's deadline passed", type="TimedOut")
                )
            )
            return
        op = run.ops.get(seq)
        if isinstance(op, StepOp):
            op.retry_at = 0
            op.state = StepState.RUNNING
            lsn = run.last_lsn
            self.when_durable(lsn, lambda: self.steps.attempt(run, op))  # its permit first
        elif op is not None and not op.done:
            run.event(R.TimerFired(seq))

    def next_due_ms(self, *, resends: bool = True) -> int:
        """The earliest timer, retry or resend this shard has (0: none): what an invoked
        worker reports. A parked run's is its bucket's start, not the load ahead of it: the
        server invokes for the timer (its lead covers the open), and the opening shard
        loads the bucket at once (recovery arms the load, already past), so the
        invocation does not wait out the load-ahead time idle."""
        due = self.index_entries.next_due_ms()
        loaded = self.timers.next_due_ms()
        if loaded and (not due or loaded < due):
            due = loaded
        for pending in self.outbox.pending.values() if resends else ():
            resend = pending.sent_at + RESEND_MS
            if not due or resend < due:
                due = resend
        return due

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run one of the shard's tasks (a message applied, a wake-up, a checkpoint, runs
        resuming): the shard's task group. A task that fails stops the shard with its
        error, so the failure reaches the callers instead of a line in the loop's log."""
        if self.closed:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None or self.closed:
            return  # a stopped or closed shard's tasks end with its own error
        log.error("shard %d: a task failed, the shard stops: %r", self.index, error)
        self.fail(error, "stopped after an internal error")

    def go_live(self) -> None:
        """Recovery is done: apply what the relay brought meanwhile, and start the sweep."""
        self.live = True
        early, self.early = self.early, []
        for item in early:
            self.on_relayed(item)
        self.start_ticks()

    def start_ticks(self) -> None:
        """The sweep runs while the shard has loaded runs or unacknowledged messages, so an
        idle shard (and a virtual clock moving over days) pays for no ticks."""
        if not self.ticking and not self.closed:
            self.ticking = True
            self.timers.add(self.now_ms() + self.engine.tick_ms, None, TICK)

    def sweep(self, now: int) -> None:
        """Every tick while runs are loaded: park idle runs, resend, checkpoint."""
        park_after = self.engine.park_after_ms
        parked = False
        self.runs_peak = max(self.runs_peak, len(self.runs))
        for run in list(self.runs.values()):
            if (
                not run.final
                and run.status == _RUNNING
                and not run.driving
                and run not in self.ready
                and now - run.last_active_ms >= park_after
                and not run.completions
                and not run.pending_start
                and not run.in_flight()
                and not run.updates_running
                and not self._loads_soon(run, now)
            ):
                if self._compacts(run):
                    continue
                self.park(run)
                parked = True
        if parked and len(self.runs) * 4 < self.runs_peak:
            # Dicts keep their peak capacity; a shard whose runs parked copies its dict so
            # the memory of runs that left goes with them.
            self.runs = dict(self.runs)
            self.runs_peak = len(self.runs)
        for pending in list(self.outbox.pending.values()):
            if pending.sent_at and now - pending.sent_at >= RESEND_MS:
                self.messages.deliver(pending.msg)
        if (
            self.appended - self.checkpoint_position >= self.engine.checkpoint_records
            and not self.checkpointing
        ):
            self.spawn(self.checkpoint())
        if self.runs or self.outbox.pending:
            self.timers.add(now + self.engine.tick_ms, None, TICK)
        else:
            self.ticking = False
            if self.appended > self.checkpoint_position and not self.checkpointing:
                # Every run parked or ended: a checkpoint now lets a crash recover from
                # the index instead of replaying every run since the last one.
                self.spawn(self.checkpoint())

    @staticmethod
    def _compacts(run: RunState) -> bool:
        """A run whose workflow compacts before it parks (an object's key) and that grew
        since its start is sent its compaction update instead (it continues as new, and
        its next run parks as one record); once per run."""
        wf = run.workflow
        if wf is None or wf.compact_update is None or len(run.journal) <= 1:
            return False
        update_id = f"{wf.compact_update}/{run.run_no}"
        if update_id in run.updates_accepted:
            return False
        run.event(R.UpdateAccepted(update_id, wf.compact_update, b"null"))
        return True

    @staticmethod
    def _loads_soon(run: RunState, now: int) -> bool:
        """Parked now, the run would be loaded back at once (its bucket loads ahead): it
        stays, or a run loaded ahead would go back and forth until its timer."""
        due = run.next_due()
        return bool(due) and load_at(due) <= now

    def park(self, run: RunState) -> None:
        """Write the run to the run store and drop it from memory; its index entry keeps
        its next due time, so the shard knows its timers without loading it."""
        key = key_of(run.wid)
        if self.index_entries.holds_key(key):
            return  # another ID shares its hash: this one stays loaded
        ref = self.put_frame(run)
        if self.closed:
            return  # the store refused the frame: the shard stopped
        due = run.next_due()
        self.index_entries.put_key(
            key, IndexEntry(run.wid, run.run_no, run.type, Status.PARKED, ref, due, key, *run.indexed_attrs())
        )
        del self.runs[run.wid]
        self.counts.parks += 1
        run.close_fibers()
        self.timers.forget(run)
        if due:
            self.timers.arm_for(load_at(due))

    def put_frame(self, run: RunState) -> int:
        """Write a run's journal to the run store; its offset. A write the store cannot make
        is reported by the store and stops the shard (a frame it cannot write is one it
        cannot reference)."""
        return self.store.put_run(sealed_frame(self.engine.codec, run.wid, run.run_no, run.journal))

    def sealed_msg(self, msg: Msg) -> Msg:
        """A message as it is stored in a checkpoint: its payload sealed, with a codec."""
        codec = self.engine.codec
        return msg if codec is None else seal_msg(codec, msg)

    def prune_finished(self) -> None:
        """Forget finished runs whose retention ended: they leave the index (lookups find
        nothing, and the ID starts afresh). Runs at each checkpoint."""
        expired = self.index_entries.expired(self.now_ms())
        for key in expired:
            self.index_entries.pop_key(key)
        if expired:
            log.debug(
                "shard %d: %d finished runs past their retention left the index", self.index, len(expired)
            )

    def run_stuck(self, run: RunState) -> None:
        self.counts.determinism_errors += 1
        self.callers.run_stuck(run)

    def metrics(self) -> dict[str, int]:
        """Its counters since this holder took it (fusee/engine/shard_metrics.py)."""
        durability, counts = self.durability, self.counts
        return {
            "records": durability.appended - durability.first,
            "bytes": durability.bytes,
            "flushes": durability.flushes,
            "flushed_records": durability.flushed_records,
            "flush_us": durability.flush_us,
            "gated_waits": durability.gated_waits,
            "gate_wait_us": durability.gate_wait_us,
            "steps_executed": self.steps_run,
            "steps_replayed": counts.steps_replayed,
            "checkpoints": counts.checkpoints,
            "parks": counts.parks,
            "determinism_errors": counts.determinism_errors,
            "busy_rejections": counts.busy_rejections,
        }

    def idle(self, *, housekeeping: bool = False) -> bool:
        return idle.is_idle(self, housekeeping=housekeeping)

    def poke(self) -> None:
        """Something changed that may change `idle()`: wake `Engine.wait_idle`."""
        if self.engine.idle_waiters:
            self.engine.activity.set()

    def report(self, *, budget_ended: bool = False, handed_back: Sequence[str] = ()) -> IdleReport:
        self.leaving = True  # reported as its holder leaves it: see `leaving`
        return idle.report(self, budget_ended=budget_ended, handed_back=handed_back)

    # -- checkpoints and close --------------------------------------------------------------

    async def checkpoint(self, *, wait: bool = False) -> None:
        position = self.checkpoint_position
        await checkpoints.take(self, wait=wait)
        if self.checkpoint_position != position:
            self.counts.checkpoints += 1
        if (
            not self.ticking
            and not self.runs
            and not self.outbox.pending
            and not self.closed
            and not self.checkpointing
            and self.appended > self.checkpoint_position
        ):
            # The last runs parked while this checkpoint was under way: the sweep that saw
            # them go found it running and took none, and no tick comes again, so the
            # shard would stay behind its log (more replay at the next open, a retirement
            # held back, a caller of wait-for-checkpoint waiting forever).
            self.spawn(self.checkpoint())

    async def close(self, deadline: float | None = None, *, budget_ended: bool = False) -> IdleReport:
        """Let go of the shard: flush, then checkpoint, then release it, and say how it was
        left. Never waits past `deadline` seconds: what is durable by then stays, the
        rest is dropped as a crash drops it, and the next holder recovers from the log.
        Steps still running are not waited for: their runs are handed back and run them
        again under the next holder (a result that arrives after this is dropped, so it
        cannot overlap the next holder's attempt)."""
        self.leaving = True
        handed_back = [wid for wid, run in self.runs.items() if run.stepping()]
        if self.closed:
            return self.report(budget_ended=budget_ended, handed_back=handed_back)
        try:
            async with asyncio.timeout(deadline):
                await self.durable_at(self.appended)
                await self.checkpoint(wait=True)
                # The race of a handback (issue 17, item 2): a call still loading its run
                # when the close began (a signal, a start) records while the checkpoint is
                # written, and its record is sent. Let go with that record not yet known
                # durable, the call would hear ClosedError and be answered Moved, and the
                # next holder would act on it again beside the record in the log. So
                # nothing more is sent from here on, and a record a caller waits for that
                # was sent is durable before the shard goes (no await between this and
                # `abandon`); a call whose record was never sent hears ClosedError.
                durability = self.durability
                durability.sealed = True
                if durability.awaited and self.durable < durability.flushed:
                    await self.durable_at(durability.flushed)
        except TimeoutError:
            log.warning(
                "shard %d: not flushed within its %.3f s deadline; let go as after a crash",
                self.index,
                deadline,
            )
            report = self.report(budget_ended=budget_ended, handed_back=handed_back)
            # Records handed to the store and not yet answered durable will be in the log
            # all the same (the server writes what came before the release, which `drop`
            # sends). A caller waiting for one must not hear ClosedError: a remote call
            # would be routed on to the next holder as never acted on, and applied twice.
            # A call the server relayed goes on as if durable, and the server holds its
            # answer until that write is done; a caller in this process cannot know, as
            # at a crash, and hears a retriable ConnectionError. No await from here to the
            # release: the answers leave behind it (Durability.settle_sent). One waiting
            # for a record never sent hears ClosedError.
            self.durability.settle_sent(
                errors.ConnectionError(
                    f"shard {self.index} was let go of before its last records were known durable "
                    "(its close missed its deadline): the call may have taken effect; retry it "
                    "with the same ID"
                )
            )
            self.drop()
            return report
        report = self.report(budget_ended=budget_ended, handed_back=handed_back)
        self.abandon()
        await self.store.close()
        return report

    def abandon(self) -> None:
        """Drop everything in memory (a crash, or after a clean close). Callers still
        waiting on the shard hear that it closed (or why it stopped), as a caller of a
        shard let go or lost hears it: none is left waiting on a shard that runs nothing."""
        self.closed = True
        self.callers.fail_all(self.loading.values())
        self.timers.cancel()
        for task in list(self.tasks):
            task.cancel()  # its task group goes with it (one running this, at its next await)
        for run in [*self.runs.values(), *self.ready]:
            for op in run.ops.values():
                stop_step(op)
            run.close_fibers()

    def drop(self) -> None:
        """Let go as a crash does: memory dropped (`abandon`) and the store released
        without a flush, so nothing more is written or acknowledged under this lease;
        the next holder recovers what was acknowledged from the log."""
        self.abandon()
        self.store.abandon()
