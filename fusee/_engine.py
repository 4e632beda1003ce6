"""The engine and run handles: start, signal, query, update and read runs."""

from __future__ import annotations

import asyncio
import base64
import difflib
import gc
import hashlib
import inspect
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

import msgspec

from fusee import _codec as codec
from fusee import _names as names
from fusee import _records as R
from fusee._clock import Clock, SystemClock
from fusee._definitions import (
    DEFAULT_RETRY,
    Query,
    Retry,
    Signal,
    Update,
    Workflow,
    query_of,
    signal_of,
    update_of,
)
from fusee._durations import Duration, to_ms
from fusee._errors import (
    AlreadyExistsError,
    ClosedError,
    Failure,
    FuseeError,
    NotFoundError,
    RejectedError,
    UnknownWorkflowError,
    WorkflowError,
    error_from,
    failure_from,
)
from fusee._messages import Ack, Msg
from fusee._recovery import recover
from fusee._run import RunState
from fusee._shard import Shard, StoredRun
from fusee._storage import MemoryStorage, Storage

Out = TypeVar("Out")
STEP_THREADS = 32
FINISHED = ("ok", "failed", "cancelled", "timed_out", "terminated")


@dataclass(slots=True)
class RunSummary:
    id: str
    run: int
    type: str
    status: str  # running, waiting_for_code, stuck, ok, failed, cancelled, timed_out, terminated
    shard: int


@dataclass(slots=True)
class RunDescription:
    summary: RunSummary
    journal: list[R.Rec] = field(default_factory=list)


class Engine:
    """Runs workflows on shards over one storage backend."""

    def __init__(
        self,
        storage: Storage,
        workflows: Sequence[Workflow[Any]],
        clock: Clock,
        park_after_ms: int,
        profile: str | None,
        record_stacks: bool,
        default_retry: Retry,
    ) -> None:
        self.storage = storage
        self.clock = clock
        self.workflows: dict[str, Workflow[Any]] = {}
        self.park_after_ms = park_after_ms
        self.tick_ms = max(10, min(park_after_ms // 2, 500))
        self.checkpoint_records = 50_000
        self.profile = profile
        self.record_stacks = record_stacks
        self.default_retry = default_retry
        self.step_mocks: dict[tuple[str, str], Callable[[int], Any]] = {}
        self.shards: list[Shard] = []  # the shards this engine holds
        self.by_index: dict[int, Shard] = {}
        self.stopped: dict[int, Shard] = {}  # shards that stopped (a failed flush): their error
        self.shard_count = storage.shards
        # Messages for shards this engine does not hold go here: the remote backend relays
        # them through the server; until one is attached they wait in `unrouted`.
        self.relay: Callable[[int, Msg | Ack], None] | None = None
        self.unrouted: list[tuple[int, Msg | Ack]] = []
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._step_threads: ThreadPoolExecutor | None = None
        self.register(*workflows)

    @classmethod
    async def open(
        cls,
        dir: str | None = None,
        *,
        workflows: Sequence[Workflow[Any]] = (),
        shards: int | None = None,
        durability: str = "memory",
        park_after: Duration = "1s",
        profile: str | None = None,
        record_stacks: bool = True,
        retry: Retry = DEFAULT_RETRY,
        clock: Clock | None = None,
        storage: Storage | None = None,
        shard_ids: Sequence[int] | None = None,
    ) -> Engine:
        """Open an engine. `durability="memory"` keeps nothing; a directory (local mode)
        needs the `fusee-server` distribution's disk path."""
        if shards is not None and shards < 1:
            raise RejectedError(f"shards={shards}: need at least 1")
        if storage is None:
            if dir is not None:
                storage = await _local_storage(dir, shards)
            elif durability == "memory":
                storage = MemoryStorage(shards or 4)
            else:
                raise RejectedError(
                    f"durability={durability!r}: open with a directory (local mode) or durability='memory'"
                )
        engine = cls(
            storage,
            workflows,
            clock or SystemClock(),
            to_ms(park_after, "park_after"),
            profile,
            record_stacks,
            retry,
        )
        try:
            await engine._open_shards(shard_ids)
        except BaseException:
            # A refused open releases what it took (a directory's lock), so the caller
            # can fix the cause and open again in the same process.
            engine.abandon()
            abandon = getattr(storage, "abandon", None)
            if abandon is not None:
                await abandon()
            raise
        return engine

    async def _open_shards(self, shard_ids: Sequence[int] | None) -> None:
        """Open and recover the shards this engine holds (all, unless `shard_ids` names
        some: an invoked worker holds only the shards it was granted)."""
        for index in shard_ids if shard_ids is not None else range(self.storage.shards):
            if not 0 <= index < self.storage.shards:
                raise RejectedError(
                    f"shard_ids: {index} is not a shard (the storage has {self.storage.shards})"
                )
            shard = Shard(self, index, await self.storage.open_shard(index))
            self.shards.append(shard)
            self.by_index[index] = shard
        # Recovery allocates a run state per run it replays, all of them kept: the cyclic
        # collector would scan them again and again for nothing (a third of the time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            for shard in self.shards:
                await recover(shard)
                shard.start_ticks()
        finally:
            if collecting:
                gc.enable()

    def register(self, *workflows: Workflow[Any]) -> None:
        """Add workflow code. Runs of these types that were waiting for their code (opened
        by an engine that lacked it) resume."""
        adding: dict[str, Workflow[Any]] = {}
        for wf in workflows:
            if not isinstance(wf, Workflow):
                raise TypeError(f"register takes workflows made with @fusee.workflow, not {wf!r}")
            known = adding.get(wf.name) or self.workflows.get(wf.name)
            if known is not None and known.fn is not wf.fn:
                raise RejectedError(
                    f"workflow type '{wf.name}' is registered twice: {_where(known.fn)} and {_where(wf.fn)}"
                )
            adding[wf.name] = wf
        for wf in adding.values():
            self.workflows[wf.name] = wf
            if not self.closed:
                for shard in self.shards:
                    if wf.name in shard.types_without_code:
                        self._spawn(shard.resume_type(wf.name))

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush and checkpoint every shard, then release the storage."""
        if self.closed:
            return
        self.closed = True
        error: BaseException | None = None
        for shard in list(self.shards):
            try:
                await shard.close()
            except Exception as exc:  # noqa: BLE001 - close the others and the storage first
                error = error or exc
                shard.abandon()
        for task in self._tasks:
            task.cancel()
        self._stop_step_threads()
        await self.storage.close()
        if error is not None:
            raise error

    def abandon(self) -> None:
        """Drop the engine's memory without flushing (a crash, for the test kit)."""
        self.closed = True
        for shard in self.shards:
            shard.abandon()
        for task in self._tasks:
            task.cancel()
        self._stop_step_threads()

    def step_threads(self) -> ThreadPoolExecutor:
        """The threads `thread=True` steps (and synchronous steps with a timeout) run on:
        the engine's own, so steps that never return cannot starve anything else that uses
        threads (the disk path has its own, the event loop's default executor is left to
        the application). A timed-out synchronous step keeps its thread until its function
        returns (Python cannot stop a thread): once all of them are held so, thread steps
        wait for one to return (docs/engine.md)."""
        if self._step_threads is None:
            self._step_threads = ThreadPoolExecutor(max_workers=STEP_THREADS, thread_name_prefix="fusee-step")
        return self._step_threads

    def _stop_step_threads(self) -> None:
        # Never waits: a step function that does not return must not hang the close.
        if self._step_threads is not None:
            self._step_threads.shutdown(wait=False, cancel_futures=True)
            self._step_threads = None

    # -- routing ------------------------------------------------------------------------

    def shard_index(self, wid: str) -> int:
        return zlib.crc32(wid.encode()) % self.shard_count

    def shard_of(self, wid: str) -> Shard:
        index = self.shard_index(wid)
        shard = self.by_index.get(index)
        if shard is None:
            stopped = self.stopped.get(index)
            if stopped is not None:
                raise stopped.stopped_error()
            raise RejectedError(
                f"workflow '{wid}' is on shard {index}, which this engine does not hold (it was "
                f"opened with shard_ids={sorted(self.by_index)}); use an engine that holds it"
            )
        return shard

    def shard_stopped(self, shard: Shard) -> None:
        """A shard stopped (a failed flush, a refused run-store write): it leaves the
        engine; calls for its workflows get its error."""
        if self.by_index.get(shard.index) is shard:
            del self.by_index[shard.index]
            self.shards.remove(shard)
            self.stopped[shard.index] = shard

    def route(self, msg: Msg) -> None:
        """Deliver a message to its target's shard, on a later turn of the loop."""
        index = self.shard_index(msg.target)
        shard = self.by_index.get(index)
        if shard is None:
            self._relay(index, msg)
        else:
            self._spawn(shard.receive(msg))

    def route_ack(self, src: int, ack: Ack) -> None:
        shard = self.by_index.get(src)
        if shard is None:
            self._relay(src, ack)
        else:
            self._spawn(shard.acked(ack))

    def _relay(self, index: int, item: Msg | Ack) -> None:
        if self.relay is not None:
            self.relay(index, item)
        else:
            self.unrouted.append((index, item))

    def _spawn(self, coro: Any) -> None:
        if self.closed:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the engine is closed; open a new one")

    def workflow_of(self, wf: Workflow[Any] | str) -> Workflow[Any]:
        if not isinstance(wf, (str, Workflow)):
            raise RejectedError(
                f"expected a workflow made with @fusee.workflow or its type name, got {type(wf).__name__}"
            )
        name = wf if isinstance(wf, str) else wf.name
        known = self.workflows.get(name)
        if known is None:
            registered = sorted(self.workflows)
            near = difflib.get_close_matches(name, registered, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise UnknownWorkflowError(
                f"no code is registered for workflow type '{name}' (registered: "
                f"{', '.join(registered) or 'none'}){hint}",
                workflow_type=name,
            )
        return known

    # -- starting -------------------------------------------------------------------------

    async def start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        version: int | None = None,
    ) -> Run[Out]:
        """Start a run; returns once its start is durable. A wrong input type, an unknown
        workflow or a taken ID is refused before anything is recorded."""
        run, _ = await self._start(wf, id, input, id_policy, timeout, version)
        return run

    async def _start(
        self,
        wf: Workflow[Any] | str,
        id: str,
        input: Any,
        id_policy: dict[str, str] | None,
        timeout: Duration | None,
        version: int | None,
        update: tuple[str, str, bytes] | None = None,
        signal: tuple[str, bytes] | None = None,
    ) -> tuple[Run[Any], RunState | Any]:
        self._check_open()
        names.name(id, "workflow ID")
        definition = self.workflow_of(wf)
        data, _ = codec.convert(input, definition.input_type, "the workflow's input")
        _check_policy(id_policy)
        timeout_ms = to_ms(timeout, "timeout") if timeout is not None else None
        if version is not None and (type(version) is not int or not 0 < version < 1 << 31):
            raise RejectedError(f"version={version!r}: expected a positive int")
        shard = self.shard_of(id)
        shard.check()
        if (id_policy or {}).get("running") == "terminate-existing":
            # A parked run is loaded first, so that ending it records its end and closes
            # its children like a loaded run's.
            await shard.load(id)
        try:
            state, new = shard.start(
                definition.name,
                id,
                data,
                policy=id_policy,
                timeout_ms=timeout_ms,
                update=update,
                version=version,
                signal=signal,
            )
        except AlreadyExistsError as error:
            await shard.durable_at(shard.appended)  # the refusal rests on durable state only
            raise error from None
        await shard.durable_at(shard.appended)
        if signal is not None and not new:
            await Run(self, id, definition)._signal_bytes(*signal)
        return Run(self, id, definition), state

    def run(self, id: str, wf: Workflow[Out] | None = None) -> Run[Out]:
        """A handle; makes no call."""
        return Run(self, id, wf)

    async def signal_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        signal: Signal[Any] | str,
        value: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
    ) -> Run[Out]:
        """Signal `id`, starting it with `input` first if it is not running; the signal is
        recorded before a new run's code first runs."""
        sig = signal_of(signal)
        names.name(sig.name, "signal name")
        payload = codec.convert(value, sig.type, f"signal '{sig.name}'")[0]
        policy = {"running": "use-existing", **(id_policy or {})}
        run, _ = await self._start(wf, id, input, policy, timeout, None, signal=(sig.name, payload))
        return run

    async def update_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        update_id: str | None = None,
    ) -> tuple[Run[Out], Any]:
        """Start `id` with the update in its start record (so the two never come apart),
        or send the update to the running run."""
        u = update_of(update)
        names.name(u.name, "update name")
        data = codec.convert(arg, u.arg, f"update '{u.name}' argument")[0]
        update_id = names.name(update_id, "update ID") if update_id is not None else str(uuid.uuid4())
        policy = {"running": "use-existing", **(id_policy or {})}
        run, state = await self._start(wf, id, input, policy, timeout, None, (update_id, u.name, data))
        if isinstance(state, RunState) and state.started.update_id == update_id:
            return run, await run._await_update(state, u, update_id)
        return run, await run.update(u, arg, id=update_id)

    # -- completions -----------------------------------------------------------------------

    async def complete(self, token: str, value: Any = None) -> None:
        await self._complete(token, codec.encode(value, "completion value"), None)

    async def fail(self, token: str, failure: BaseException | str | Failure) -> None:
        if isinstance(failure, str):
            envelope = Failure(failure)
        elif isinstance(failure, Failure):
            envelope = failure
        else:
            envelope = failure_from(failure, self.record_stacks)
        await self._complete(token, None, envelope)

    async def _complete(self, token: str, value: bytes | None, failure: Failure | None) -> None:
        self._check_open()
        wid, run_no, seq, attempt, _mac = parse_token(token)
        shard = self.shard_of(wid)
        state = await shard.load(wid)
        op = state.ops.get(seq) if state is not None and state.run_no == run_no else None
        if (
            state is None
            or op is None
            or op.done
            or not getattr(op, "sent", False)
            or getattr(op, "attempt", 0) != attempt
            or make_token(wid, run_no, seq, attempt, state.started.seed) != token
        ):
            await shard.durable_at(shard.appended)  # the refusal rests on durable state only
            raise RejectedError(
                "the completion token is stale: its step finished, or a newer attempt holds it"
            )
        state.event(R.Completed(seq, value, failure))
        await shard.durable_at(state.last_lsn)

    # -- listing ---------------------------------------------------------------------------

    async def list(self, type: str | None = None, status: str | None = None) -> AsyncIterator[RunSummary]:
        for shard in self.shards:
            rows = [RunSummary(r.wid, r.run_no, r.type, _status(r), shard.index) for r in shard.runs.values()]
            seen = shard.appended
            rows += [
                RunSummary(
                    wid, e.run_no, e.type, "running" if e.status == "parked" else e.status, shard.index
                )
                for wid, e in await shard.indexed()
            ]
            await shard.durable_at(seen)  # statuses leave the process once durable
            for row in rows:
                if (type is None or row.type == type) and (status is None or row.status == status):
                    yield row


class Run(Generic[Out]):
    """A handle on the runs of one workflow ID; makes no call until used.

    Every answer and every refusal leaves only once the state it rests on is durable: a
    run that ended in memory refuses a signal as ended only once its end is in the log,
    so a crash cannot bring back a run the caller was told had ended."""

    def __init__(self, engine: Engine, id: str, wf: Workflow[Any] | None) -> None:
        self.engine = engine
        self.id = id
        self.workflow = wf

    def __repr__(self) -> str:
        return f"<fusee.Run {self.id!r}>"

    @property
    def _shard(self) -> Shard:
        self.engine._check_open()
        return self.engine.shard_of(names.name(self.id, "workflow ID"))

    async def _refuse(self, shard: Shard, error: FuseeError) -> NoReturn:
        await shard.durable_at(shard.appended)
        raise error

    async def _loaded(self, shard: Shard) -> RunState | None:
        """The run in memory (loading a parked one), having taken its first turn."""
        state = await shard.load(self.id)
        if state is not None:
            shard.turn(state)
        return state

    async def _running(self, shard: Shard) -> RunState:
        state = await self._loaded(shard)
        if state is None or state.final:
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        return state

    async def signal(self, signal: Signal[Any] | str, value: Any = None) -> None:
        """Record a signal; returns once it is durable. A value that does not match the
        signal's type is refused before anything is recorded. A stuck run (its code does
        not match its journal) records it too; the run takes it once its code is fixed."""
        sig = signal_of(signal)
        names.name(sig.name, "signal name")
        payload = codec.convert(value, sig.type, f"signal '{sig.name}'")[0]
        await self._signal_bytes(sig.name, payload)

    async def _signal_bytes(self, name: str, payload: bytes) -> None:
        shard = self._shard
        state = await self._running(shard)
        state.event(R.SignalReceived(name, payload))
        await shard.durable_at(state.last_lsn)

    async def query(self, query: Query[Any, Any] | str, arg: Any = None) -> Any:
        """Answer from the run's state; released once the state it read is durable."""
        q = query_of(query)
        names.name(q.name, "query name")
        shard = self._shard
        value = codec.convert(arg, q.arg, "query argument")[1]
        state = await self._loaded(shard)
        if state is None:
            stored = await shard.finished_run(self.id)
            if stored is None:
                await self._refuse(shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id))
            assert stored is not None
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has ended ({stored.status}); queries need a running run"
                ),
            )
        assert state is not None
        try:
            self._check_answerable(shard, state, "query")
        except RejectedError as error:
            await self._refuse(shard, error)
        if state.final:
            await self._refuse(
                shard,
                RejectedError(f"workflow '{self.id}' has ended ({state.status}); queries need a running run"),
            )
        handler = state.query_handlers.get(q.name)
        if handler is None:
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has no handler for query '{q.name}' "
                    f"(handlers: {', '.join(sorted(state.query_handlers)) or 'none'})"
                ),
            )
        assert handler is not None
        try:
            answer = handler[1](value)
        except Exception as exc:  # noqa: BLE001 - the handler's failure, as an envelope
            await self._refuse(shard, WorkflowError(failure_from(exc, self.engine.record_stacks)))
        if inspect.isawaitable(answer):
            _close(answer)
            await self._refuse(
                shard, RejectedError(f"query '{q.name}': a query handler must be a plain function, not async")
            )
        data = codec.encode(answer, f"query '{q.name}' answer")
        await shard.durable_at(state.last_lsn)
        return codec.decode(data, q.result, f"query '{q.name}' answer")

    def _check_answerable(self, shard: Shard, state: RunState, what: str) -> None:
        """A run whose code cannot run here has no handlers to ask (checked before the
        durability wait of the refusal, which the caller does)."""
        if state.status == "stuck" and state.stuck_error is not None:
            raise RejectedError(f"{what} refused: {state.stuck_error.message}")
        if state.status == "waiting_for_code":
            raise RejectedError(
                f"{what} refused: workflow '{self.id}' waits for the code of its type '{state.type}', "
                "which this engine does not have registered"
            )

    async def update(self, update: Update[Any, Any] | str, arg: Any = None, *, id: str | None = None) -> Any:
        """Run an update's handler in the workflow. The validator runs first (a refusal
        records nothing); the same update ID gets the recorded result."""
        u = update_of(update)
        names.name(u.name, "update name")
        update_id = names.name(id, "update ID") if id is not None else str(uuid.uuid4())
        shard = self._shard
        data, value = codec.convert(arg, u.arg, f"update '{u.name}' argument")
        state = await self._loaded(shard)
        if state is None:
            finished = await shard.finished_run(self.id)
            done = finished and next(
                (r for r in finished.journal if isinstance(r, R.UpdateDone) and r.id == update_id), None
            )
            if done:
                return _update_result(u, done)
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        done = _recorded_update(state, update_id)
        if done is not None:
            await shard.durable_at(state.last_lsn)
            return _update_result(u, done)
        if state.final:
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        if update_id in state.updates_accepted:
            return _update_result(u, await self._update_waiter(shard, update_id))
        try:
            self._check_answerable(shard, state, f"update '{u.name}'")
        except RejectedError as error:
            await self._refuse(shard, error)
        handler = state.update_handlers.get(u.name)
        if handler is None:
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has no handler for update '{u.name}' "
                    f"(handlers: {', '.join(sorted(state.update_handlers)) or 'none'})"
                ),
            )
        assert handler is not None
        validate = handler[2]
        if validate is not None:
            try:
                verdict = validate(value)
            except Exception as exc:  # noqa: BLE001 - a refusal, whatever its type
                await self._refuse(shard, RejectedError(f"update '{u.name}' refused: {exc}"))
            if inspect.isawaitable(verdict):
                _close(verdict)
                await self._refuse(
                    shard,
                    RejectedError(f"update '{u.name}': a validator must be a plain function, not async"),
                )
            if isinstance(verdict, str) or verdict is False:
                await self._refuse(
                    shard, RejectedError(f"update '{u.name}' refused: {verdict or 'the validator said no'}")
                )
        fut = self._update_waiter(shard, update_id)
        state.event(R.UpdateAccepted(update_id, u.name, data))
        return _update_result(u, await fut)

    def _update_waiter(self, shard: Shard, update_id: str) -> asyncio.Future[R.UpdateDone]:
        fut: asyncio.Future[R.UpdateDone] = asyncio.get_running_loop().create_future()
        shard.update_waiters.setdefault((self.id, update_id), []).append(fut)
        return fut

    async def _await_update(self, state: RunState, u: Update[Any, Any], update_id: str) -> Any:
        """The answer to an update that rode in `state`'s start record. The run object is
        the one the start made, even if it has ended or continued as new since (its
        results are still on it)."""
        shard = self._shard
        done = _recorded_update(state, update_id)
        if done is not None:
            await shard.durable_at(state.last_lsn)
            return _update_result(u, done)
        if state.final or state.status == "stuck":
            await self._refuse(
                shard,
                RejectedError(
                    f"update '{u.name}' has no answer: workflow '{self.id}' "
                    + ("is stuck" if state.status == "stuck" else f"ended ({state.status})")
                    + " before the update finished"
                ),
            )
        return _update_result(u, await self._update_waiter(shard, update_id))

    async def result(self) -> Out:
        """The run's result (following continue-as-new); raises its failure."""
        shard = self._shard
        while True:
            state: Any = shard.runs.get(self.id)
            if state is None:
                state = await shard.finished_run(self.id)
                if state is None or state.status not in FINISHED:
                    # Parked or waiting for code: loaded, so a run whose code no longer
                    # matches its journal is found stuck rather than waited on for ever.
                    state = await shard.load(self.id) or state
                if state is None:
                    await self._refuse(shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id))
            if state.status in FINISHED:
                if isinstance(state, RunState):
                    await shard.durable_at(state.last_lsn)
                return self._outcome(state)
            if state.status == "stuck" and self.engine.profile == "dev" and state.stuck_error:
                raise state.stuck_error
            fut: asyncio.Future[RunState] = asyncio.get_running_loop().create_future()
            shard.result_waiters.setdefault(self.id, []).append(fut)
            await fut

    def _outcome(self, state: RunState | StoredRun) -> Out:
        rec = state.outcome
        assert isinstance(rec, R.Finished)
        if rec.status == "ok":
            wf = self.workflow or self.engine.workflows.get(state.type)
            result: Out = codec.decode(
                rec.value or b"null", wf.output_type if wf else Any, "the workflow's result"
            )
            return result
        raise error_from(rec.failure or Failure(rec.status))

    async def status(self) -> RunSummary:
        return (await self.describe()).summary

    async def describe(self) -> RunDescription:
        """The summary and the journal, as records."""
        shard = self._shard
        state = await self._loaded(shard) or await shard.finished_run(self.id)
        if state is None:
            await self._refuse(shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        description = RunDescription(
            RunSummary(self.id, state.run_no, state.type, _status(state), shard.index), list(state.journal)
        )
        # What it shows leaves the process: only once every record behind it is durable.
        await shard.durable_at(shard.appended)
        return description

    async def cancel(self, reason: str | None = None) -> None:
        """Ask the run to stop: its code gets CancelledError at the operations it waits
        on, and its compensations run. A stuck run records the request and takes it once
        its code is fixed."""
        reason = names.text(reason, "cancel reason")
        shard = self._shard
        state = await self._running(shard)
        state.event(R.CancelRequested(reason))
        await shard.durable_at(state.last_lsn)

    async def terminate(self, reason: str | None = None) -> None:
        """End the run at once: nothing of its code runs after this, not even compensation."""
        reason = names.text(reason, "terminate reason")
        shard = self._shard
        state = await self._running(shard)
        state.end(R.Finished("terminated", failure=Failure(reason or "terminated", type="Terminated")))
        await shard.durable_at(state.last_lsn)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


async def _local_storage(dir: str, shards: int | None) -> Storage:
    """Local mode needs the disk path of the fusee-server distribution."""
    try:
        from fusee_server.local import LocalStorage
    except ImportError:
        raise RejectedError(
            "local mode (Engine.open(dir)) needs the fusee-server distribution, which holds the "
            "disk path: pip install fusee-server (in this repository: pip install ./server)"
        ) from None
    return await LocalStorage.open(dir, shards)


def _recorded_update(state: RunState, update_id: str) -> R.UpdateDone | None:
    """An update's recorded answer. A stuck run has records its replay did not reach, and
    a run waiting for its code has not been replayed at all: its answer may be among them."""
    done = state.update_results.get(update_id)
    if done is None and state.status in ("stuck", "waiting_for_code"):
        done = next((r for r in state.journal if isinstance(r, R.UpdateDone) and r.id == update_id), None)
    return done


def _update_result(u: Update[Any, Any], rec: R.UpdateDone) -> Any:
    if rec.failure is not None:
        raise error_from(rec.failure)
    return codec.decode(rec.value or b"null", u.result, f"update '{u.name}' result")


def _status(state: RunState | StoredRun) -> str:
    return "running" if state.status == "running" else state.status


def _check_policy(policy: dict[str, str] | None) -> None:
    allowed = {
        "running": ("fail", "use-existing", "terminate-existing"),
        "finished": ("allow", "allow-if-failed", "refuse", "use-existing"),
    }
    for key, value in (policy or {}).items():
        if key not in allowed or value not in allowed[key]:
            raise RejectedError(f"id_policy {key}={value!r}: allowed are {allowed}")


def _where(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def make_token(wid: str, run: int, seq: int, attempt: int, seed: int) -> str:
    """A completion token names the run, the step and the attempt; its MAC over the
    run's recorded seed makes it unguessable and lets a stale one be refused."""
    body = msgspec.json.encode([wid, run, seq, attempt])
    mac = hashlib.blake2b(body, key=seed.to_bytes(8, "big"), digest_size=12).digest()
    return base64.urlsafe_b64encode(body).decode().rstrip("=") + "." + base64.urlsafe_b64encode(mac).decode()


def parse_token(token: str) -> tuple[str, int, int, int, str]:
    try:
        if type(token) is not str:
            raise TypeError
        body, mac = token.split(".", 1)
        wid, run, seq, attempt = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if not (type(wid) is str and type(run) is int and type(seq) is int and type(attempt) is int):
            raise TypeError
        return names.name(wid, "workflow ID"), run, seq, attempt, mac
    except (ValueError, TypeError, msgspec.DecodeError, RejectedError):
        raise RejectedError("not a completion token") from None
