"""The engine and run handles: start, signal, query, update and read runs."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from fusee import _codec as codec
from fusee import _names as names
from fusee._clock import Clock, SystemClock
from fusee._errors import (
    AlreadyExistsError,
    ClosedError,
    Failure,
    FuseeError,
    LeaseLostError,
    NotFoundError,
    RejectedError,
    failure_from,
)
from fusee._sealing import AesGcm, seal_msg
from fusee.engine import idle, opening, registry
from fusee.engine.coordinators import Coordinators
from fusee.engine.coordinators.concurrency import from_outside
from fusee.engine.idle import IdleReport
from fusee.engine.limits import Limits
from fusee.engine.limits.handle import WORKFLOW as LIMIT_WORKFLOW
from fusee.engine.objects import ObjectRef, Objects
from fusee.engine.run import RunState
from fusee.engine.run_handle import Run, RunSummary, list_runs
from fusee.engine.schedules import ScheduleHandle, Schedules
from fusee.engine.shard import Shard
from fusee.engine.shard_metrics import zeros
from fusee.engine.step_threads import StepThreads
from fusee.engine.tokens import take_completion
from fusee.journal import Ack, Msg
from fusee.storage import Durability, Storage
from fusee.workflow.definitions import (
    DEFAULT_RETRY,
    Retry,
    Signal,
    Update,
    Workflow,
    check_on_exhausted,
    signal_of,
    update_of,
)
from fusee.workflow.durations import Duration, at_ms, to_ms
from fusee.workflow.objects import ObjectType

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from fusee.engine.telemetry import Telemetry


Out = TypeVar("Out")


class Engine:
    """Runs workflows on shards over one storage backend."""

    # What a step out of retries does when its policy does not say: "fail" or "pause".
    on_exhausted = "fail"
    # Payload encryption (`Engine.open(codec=fusee.aes_gcm(keys))`, fusee/_sealing.py):
    # None, payloads stored plain, and every sealing site costs one test of this.
    codec: AesGcm | None = None

    def __init__(
        self,
        storage: Storage,
        workflows: Sequence[Workflow[Any] | ObjectType],
        clock: Clock,
        park_after_ms: int,
        retention_ms: int,
        profile: str | None,
        record_stacks: bool,
        default_retry: Retry,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.storage = storage
        self.telemetry = telemetry  # None: traces off, and opentelemetry never imported
        self.clock = clock
        self.workflows: dict[str, Workflow[Any]] = {}
        self.park_after_ms = park_after_ms
        self.retention_ms = retention_ms  # how long a finished run stays in the index
        self.activity = asyncio.Event()  # set when a shard's state changes, while one waits
        self.idle_waiters = 0
        self.tick_ms = max(10, min(park_after_ms // 2, 500))
        self.checkpoint_records = 50_000
        self.profile = profile
        self.record_stacks = record_stacks
        self.default_retry = default_retry
        self.step_mocks: dict[tuple[str, str], Callable[[int], Any]] = {}
        self.callback_base: str | None = None  # set_callback_url, or the site serve() opened
        self.shards: list[Shard] = []  # the shards this engine holds
        self.by_index: dict[int, Shard] = {}
        self.stopped: dict[int, Shard] = {}  # shards that stopped (a failed flush): their error
        self.shard_count = storage.shards
        self.closed = False
        # Server mode's call server: answers what it accepted for a shard before the shard
        # is let go of (a call failed back after its record was written is applied twice
        # when retried). Given the shard and how long it may take.
        self.before_leave: Callable[[int, float | None], Awaitable[None]] | None = None
        self._step_threads = StepThreads()
        # Objects: each type a built-in workflow, one run per key (docs/objects.md).
        self.object_calls = Objects(self)
        self.register(*workflows, *self.object_calls.builtin())
        # Schedules are runs of a built-in workflow bound to this engine (docs/schedules.md).
        self.schedules = Schedules(self)
        self.register(self.schedules.workflow())
        # Debounce and batch coordinators: built-in workflows too (docs/coordinators.md).
        self.coordinators = Coordinators(self)
        self.register(*self.coordinators.workflows())
        # Limits: definitions stored as runs of a built-in workflow, permits in memory
        # shared by every shard of this engine (docs/limits.md).
        self.permits = Limits(self)
        self.register(LIMIT_WORKFLOW)
        self.limit = self.permits.limit  # limit(name, concurrent=, per_second=)
        self.limits = self.permits.limits
        self.limit_usage = self.permits.limit_usage

    @classmethod
    async def open(
        cls,
        dir: str | None = None,
        *,
        workflows: Sequence[Workflow[Any]] = (),
        objects: Sequence[ObjectType] = (),
        shards: int | None = None,
        durability: str = "memory",
        park_after: Duration = "1s",
        retention: Duration = "7d",
        profile: str | None = None,
        record_stacks: bool = True,
        retry: Retry = DEFAULT_RETRY,
        on_exhausted: str = "fail",
        clock: Clock | None = None,
        storage: Storage | None = None,
        shard_ids: Sequence[int] | None = None,
        address: str | None = None,
        telemetry: Telemetry | None = None,
        codec: AesGcm | None = None,
        backup: str | None = None,
    ) -> Engine:
        """Open an engine. `durability="memory"` keeps nothing; a directory (local mode)
        needs the `fusee-server` distribution's disk path; `durability="server"` (or
        `FUSEE_URL` set, for an `open()` without arguments) connects to a `fusee server`
        at `address` as a worker: it holds the shards it is granted now, takes others as
        they are let go of, and answers the calls clients send to its shards. If its
        connection goes (a server restart), it connects again by itself until closed, and
        takes its shards back (docs/server.md, *Reconnecting*). `telemetry=
        fusee.open_telemetry()` traces runs through OpenTelemetry (docs/telemetry.md).
        `codec=fusee.aes_gcm(keys)` encrypts every payload before it is stored or leaves
        the process (docs/engine.md, *Payload encryption*). `backup="s3://bucket/prefix"`
        (or a directory) backs a data directory up continuously (docs/backup.md)."""
        if shards is not None and shards < 1:
            raise RejectedError(f"shards={shards}: need at least 1")
        on_exhausted = check_on_exhausted(on_exhausted, "Engine.open(on_exhausted=)")
        if codec is not None and not isinstance(codec, AesGcm):
            raise RejectedError(f"codec={codec!r}: expected fusee.aes_gcm(keys) (or None)")
        if storage is None:
            storage, granted = await opening.storage_for(dir, shards, durability, address, backup)
            shard_ids = granted if shard_ids is None else shard_ids
        engine = cls(
            storage,
            [*workflows, *objects],  # register() takes both
            clock or SystemClock(),
            to_ms(park_after, "park_after"),
            to_ms(retention, "retention"),
            profile,
            record_stacks,
            retry,
            _telemetry(telemetry),
        )
        engine.on_exhausted = on_exhausted  # a step's Retry(on_exhausted=) overrides it
        engine.codec = codec  # before any shard opens: recovery opens what is sealed
        try:
            await opening.open_shards(engine, shard_ids)
        except BaseException:
            # A refused open releases what it took (a directory's lock), so the caller
            # can fix the cause and open again in the same process.
            engine.abandon()
            abandon = getattr(storage, "abandon", None)
            if abandon is not None:
                await abandon()
            raise
        if getattr(storage, "durability", None) is Durability.SERVER:
            from fusee.engine.remote_calls import CallServer  # the cold path imports no wire code

            CallServer(engine, storage)  # type: ignore[arg-type]
        return engine

    def check_index(self, index: int) -> None:
        if type(index) is not int or not 0 <= index < self.storage.shards:
            raise RejectedError(
                f"shard_ids: {index!r} is not a shard (the storage has {self.storage.shards})"
            )

    async def attach(self, index: int) -> None:
        """Take shard `index` while the engine runs (a standby taking a shard another
        holder let go): open it under a new lease, recover it, and start its timers."""
        self._check_open()
        self.check_index(index)
        if index in self.by_index:
            raise RejectedError(f"shard {index} is attached already")
        await opening.attach(self, index)

    def attached(self, shard: Shard) -> None:
        """A recovered shard goes into service (`opening.attach`)."""
        self.by_index[shard.index] = shard
        self.shards.append(shard)
        self.shards.sort(key=lambda s: s.index)
        self.stopped.pop(shard.index, None)
        shard.go_live()

    async def detach(self, index: int, deadline: float | None = None) -> IdleReport:
        """Let go of shard `index` while the engine runs (an invoked worker's budget
        ended, a drain finished): close it as `close` does (flush, then checkpoint,
        within `deadline` seconds) and hand it back; calls for its workflows are
        refused from then on. A shard that fails to close is dropped as a crash drops it
        (nothing more is written or answered for it): its next holder recovers what was
        acknowledged from the log."""
        self._check_open()
        _seconds(deadline, "deadline")
        shard = self.by_index.get(index)
        if shard is None:
            raise RejectedError(f"shard {index} is not attached to this engine")
        deadline = await self._calls_answered([index], deadline)
        if self.by_index.get(index) is shard:  # else it stopped meanwhile (a lost lease)
            self._leave(shard)
        try:
            return await shard.close(deadline)
        except Exception:
            shard.drop()  # as `close` does with a shard that failed to close
            raise

    async def _calls_answered(self, indexes: list[int], deadline: float | None) -> float | None:
        """Let the call server answer what it accepted for these shards (up to half of
        `deadline`); what is left of `deadline` for closing them."""
        if self.before_leave is None or not indexes:
            return deadline
        loop = asyncio.get_running_loop()
        began = loop.time()
        share = None if deadline is None else deadline / 2
        await asyncio.gather(*(self.before_leave(index, share) for index in indexes))
        return None if deadline is None else max(0.0, deadline - (loop.time() - began))

    def register(self, *workflows: Workflow[Any] | ObjectType) -> None:
        """Add workflow code and object types. Runs of these types that were waiting for
        their code (opened by an engine that lacked it) resume."""
        code = [Objects.workflow_of(w) if isinstance(w, ObjectType) else w for w in workflows]
        for wf in registry.added(self.workflows, code):
            self.workflows[wf.name] = wf
            if not self.closed:
                for shard in self.shards:
                    if wf.name in shard.types_without_code:
                        shard.spawn(shard.resume_type(wf.name))

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self, deadline: float | None = None, *, budget_ended: bool = False) -> list[IdleReport]:
        """Close every shard side by side (flush, then checkpoint), then release the
        storage; never waits past `deadline` seconds (see `Shard.close`). Returns how
        each shard was left."""
        _seconds(deadline, "deadline")
        if self.closed:
            return []
        self.closed = True
        shards = list(self.shards)
        deadline = await self._calls_answered([shard.index for shard in shards], deadline)
        closing = [shard.close(deadline, budget_ended=budget_ended) for shard in shards]
        results = await asyncio.gather(*closing, return_exceptions=True)
        reports: list[IdleReport] = []
        error: BaseException | None = None
        for shard, result in zip(shards, results, strict=True):
            if isinstance(result, BaseException):
                error = error or result  # the others and the storage are closed first
                shard.drop()
            else:
                reports.append(result)
        self._step_threads.stop()
        self.permits.close()
        await self.schedules.close()
        await self.coordinators.close()
        await self.object_calls.close()
        await self.storage.close()
        if error is not None:
            raise error
        return reports

    def abandon(self) -> None:
        """Drop the engine's memory without flushing (a crash, for the test kit)."""
        self.closed = True
        for shard in self.shards:
            shard.abandon()
        self._step_threads.stop()
        self.permits.close()

    def step_threads(self) -> ThreadPoolExecutor:
        """The threads `thread=True` steps run on (`StepThreads`)."""
        return self._step_threads.get()

    # -- routing ------------------------------------------------------------------------

    def shard_index(self, wid: str) -> int:
        return zlib.crc32(wid.encode()) % self.shard_count

    def shard_of(self, wid: str) -> Shard:
        index = self.shard_index(wid)
        shard = self.by_index.get(index)
        if shard is not None and shard.draining:
            raise LeaseLostError(
                f"shard {index} is draining: this engine is letting it go; retry (its next holder answers)"
            )
        if shard is None:
            stopped = self.stopped.get(index)
            if stopped is not None:
                raise stopped.stopped_error()
            raise RejectedError(
                f"workflow '{wid}' is on shard {index}, which this engine does not hold (it was "
                f"opened with shard_ids={sorted(self.by_index)}); use an engine that holds it"
            )
        return shard

    # -- metrics ---------------------------------------------------------------------------

    def shard_metrics(self) -> list[dict[str, int]]:
        """Each shard's counters, the shard number its position in the list: since this
        engine took it, or zeros for a shard it does not hold (docs/telemetry.md)."""
        counters = [zeros() for _ in range(self.shard_count)]
        for shard in self.shards:
            counters[shard.index] = shard.metrics()
        return counters

    # -- idle, for invoked workers ---------------------------------------------------------

    def idle(self) -> bool:
        """Every shard this engine holds is idle (docs/engine.md, *Idle, for invoked workers*)."""
        return all(shard.idle() for shard in self.shards)

    async def wait_idle(self, grace: float = 0.1, timeout: float | None = None) -> bool:
        """Wait until every shard has been idle for `grace` seconds on end (an invoked
        worker's 100 ms: a trickle of calls shares one invocation; a shard's checkpoint
        meanwhile delays the end, but does not restart the grace); False if `timeout`
        seconds pass first. Woken by the shards' own changes, and by the clock when a
        shard's next due time comes within 250 ms: nothing is polled."""
        _seconds(grace, "grace")
        _seconds(timeout, "timeout")
        return await idle.wait_idle(self, grace, timeout)

    def drain(self, indexes: Sequence[int] | None = None) -> None:
        """Route nothing new to these shards (all, by default) and answer what was already
        routed: new calls are refused with LeaseLostError (the caller retries against the
        shard's next holder) and messages from other shards are left unanswered (their
        senders send them again). An invoked worker drains before it leaves."""
        for index in indexes or ():
            self.check_index(index)
            if index not in self.by_index:
                raise RejectedError(f"shard {index} is not attached to this engine")
        for shard in self.shards:
            if indexes is None or shard.index in indexes:
                shard.draining = True

    def report(self, index: int, *, budget_ended: bool = False) -> IdleReport:
        """How shard `index` stands as its holder leaves it: what an invoked worker sends
        the server (IDLE) before it lets the shard go, since the server counts a report
        only from the holder of the epoch it names (docs/invoke.md, *One request*). A shard that
        stopped while this engine held it (a lost lease, a refused write) is reported as
        it was when it stopped."""
        shard = self.by_index.get(index) or self.stopped.get(index)
        if shard is None:
            raise RejectedError(f"shard {index} is not attached to this engine")
        return shard.report(budget_ended=budget_ended)

    def stop_error(self, index: int) -> FuseeError | None:
        """Why shard `index` stopped while this engine held it (None: it did not, or it
        was attached again since): what its callers were told."""
        shard = self.stopped.get(index)
        return shard.stop_error if shard is not None else None

    def shard_stopped(self, shard: Shard) -> None:
        """A shard stopped (a failed write, a lost lease): it leaves the engine; calls for
        its workflows get its error."""
        if self.by_index.get(shard.index) is shard:
            self._leave(shard)
            self.stopped[shard.index] = shard

    def _leave(self, shard: Shard) -> None:
        del self.by_index[shard.index]
        self.shards.remove(shard)

    def route(self, msg: Msg) -> None:
        """Deliver a message to its target's shard, on a later turn of the loop; one this
        engine does not hold goes through the storage's relay."""
        index = self.shard_index(msg.target)
        shard = self.by_index.get(index)
        if shard is None:
            # To another worker, through the server: a child's input, a signal's value and
            # a result leave sealed.
            self.storage.relay(index, msg if self.codec is None else seal_msg(self.codec, msg))
        else:
            shard.spawn(shard.messages.receive(msg))

    def route_ack(self, src: int, ack: Ack) -> None:
        shard = self.by_index.get(src)
        if shard is None:
            self.storage.relay(src, ack)
        else:
            shard.spawn(shard.messages.acked(ack))

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the engine is closed; open a new one")

    def workflow_of(self, wf: Workflow[Any] | str) -> Workflow[Any]:
        return registry.registered(self.workflows, wf)

    def set_callback_url(self, base: str | None) -> None:
        """Where this engine's HTTP API is reached from outside (behind a proxy:
        `https://example.com/fusee`): `await_completion`'s `cb.url` is
        `{base}/v1/complete/{token}`. None: the site `serve()` opened, or the server's
        `--public-url` in server mode."""
        if base is not None and not base.startswith(("http://", "https://")):
            raise RejectedError(f"set_callback_url({base!r}): expected an http:// or https:// URL")
        self.callback_base = base.rstrip("/") if base is not None else None

    def callback_url(self, token: str) -> str | None:
        """`cb.url` for a completion token: None when no HTTP API is known to reach it."""
        base = self.callback_base or getattr(self.storage, "callback_url", None)
        return f"{base}/v1/complete/{token}" if base else None

    async def serve(self, addr: str = "127.0.0.1:7601", *, token: str | None = None) -> Any:
        """Serve the HTTP API (`/v1`, docs/http-api.md) of this engine on `addr`
        (`HOST:PORT`, port 0 for a free one) until the returned site's `close()`; with
        `token`, every request needs it as its bearer. Needs the fusee-server
        distribution (aiohttp), imported only here."""
        try:
            from fusee_server.http_engine import serve_at
        except ImportError:
            raise RejectedError(
                "engine.serve() needs the fusee-server distribution, which holds the HTTP API: "
                "pip install fusee-server (in this repository: pip install ./server)"
            ) from None
        self._check_open()
        site = await serve_at(self, addr, token)
        if self.callback_base is None:  # set_callback_url (a proxy's address) wins
            self.callback_base = site.url
        return site

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
        delay: Duration | None = None,
        at: datetime | int | float | None = None,
        traceparent: str | None = None,
    ) -> Run[Out]:
        """Start a run; returns once its start is durable. A wrong input type, an unknown
        workflow or a taken ID is refused before anything is recorded. With `delay=` or
        `at=` the run exists under its ID at once and its code begins then. The start
        records `traceparent` (a W3C header value), else, with telemetry on, the active
        span's (docs/telemetry.md)."""
        not_before = delayed_until(self.clock.now_ms(), delay, at)
        self._check_open()
        names.name(id, "workflow ID")
        definition = self.workflow_of(wf)
        if definition.concurrency is not None and not not_before and id_policy is None and from_outside():
            # Runs at once: the start waits its turn in the type's queue (docs/coordinators.md).
            queued: Run[Out] = await self.coordinators.enqueue(definition, id, input)
            return queued
        run, _ = await self._start(
            wf, id, input, id_policy, timeout, version, not_before=not_before, traceparent=traceparent
        )
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
        not_before: int = 0,
        traceparent: str | None = None,
    ) -> tuple[Run[Any], RunState | Any]:
        self._check_open()
        if traceparent is None and self.telemetry is not None:
            traceparent = self.telemetry.traceparent()
        elif traceparent is not None:
            traceparent = check_traceparent(traceparent)
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
                not_before=not_before,
                traceparent=traceparent,
            )
        except AlreadyExistsError as error:
            await shard.durable_at(shard.durability.appended)  # the refusal rests on durable state only
            raise error from None
        await shard.durable_at(shard.durability.appended)
        if signal is not None and not new:
            await Run(self, id, definition)._signal_bytes(*signal)
        return Run(self, id, definition), state

    def run(self, id: str, wf: Workflow[Out] | None = None) -> Run[Out]:
        """A handle; makes no call."""
        return Run(self, id, wf)

    async def schedule(
        self, name: str, spec: Any, wf: Workflow[Any] | str, input: Any = None
    ) -> ScheduleHandle:
        """Create or update a schedule (docs/schedules.md); its handle."""
        return await self.schedules.create(name, spec, wf, input)

    async def debounce(
        self, wf: Workflow[Any] | str, key: str, input: Any = None, **options: Any
    ) -> Run[Any]:
        """Collapse starts of `wf` with `key` inside `window=` into one run (docs/coordinators.md)."""
        run: Run[Any] = await self.coordinators.debounce(wf, key, input, **options)
        return run

    async def batch(self, wf: Workflow[Any] | str, key: str, event: Any = None, **options: Any) -> Run[Any]:
        """Add an event to the key's batch; one run per batch (docs/coordinators.md)."""
        run: Run[Any] = await self.coordinators.batch(wf, key, event, **options)
        return run

    def object(self, type: str | ObjectType, key: str | None = None) -> Any:
        """`engine.object("cart")`: a new object type, registered (add its handlers with
        `@cart.exclusive` and `@cart.shared`); `engine.object("cart", key)`: that key's
        `ObjectRef` (docs/objects.md)."""
        if key is not None:
            return self.object_ref(type.name if isinstance(type, ObjectType) else type, key)
        ot = type if isinstance(type, ObjectType) else ObjectType(type)
        self.register(ot)
        return ot

    def object_ref(self, type: str, key: str) -> ObjectRef:
        """One key of an object type: `call`, `send`, `state`, `inspect`, `delete`, and
        the edits `set_state`, `patch_state`, `clear_state`, `edit_state`."""
        return self.object_calls.ref(type, key)

    def objects(self, type: str, limit: int | None = None) -> AsyncIterator[str]:
        """The keys of an object type that exist."""
        return self.object_calls.keys(type, limit)

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
        accepted: bool = False,
    ) -> tuple[Run[Out], Any]:
        """Start `id` with the update in its start record (so the two never come apart),
        or send the update to the running run. With `accepted`, the answer is None once
        the update is accepted (durable), not its result."""
        u = update_of(update)
        names.name(u.name, "update name")
        data = codec.convert(arg, u.arg, f"update '{u.name}' argument")[0]
        update_id = names.name(update_id, "update ID") if update_id is not None else str(uuid.uuid4())
        policy = {"running": "use-existing", **(id_policy or {})}
        run, state = await self._start(wf, id, input, policy, timeout, None, (update_id, u.name, data))
        if isinstance(state, RunState) and state.started.update_id == update_id:
            if accepted:
                await self.shard_of(id).durable_at(state.last_lsn)
                return run, None
            return run, await run._await_update(state, u, update_id)
        return run, await run.update(u, arg, id=update_id, accepted=accepted)

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
        await take_completion(self.shard_of, token, value, failure)

    # -- listing ---------------------------------------------------------------------------

    def list(
        self,
        type: str | None = None,
        status: str | None = None,
        *,
        where: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RunSummary]:
        """The runs of every shard this engine holds, of `type` and `status`, that `where`
        matches (`{"status": "paid", "amount": {"gte": 100}}`: docs/engine.md, *Search
        attributes*), at most `limit`."""
        return list_runs(self.shards, type, status, where, limit)

    async def export_journal(self, id: str) -> dict[str, Any]:
        """The run's journal as an export (what `fusee export` writes to a `.fjnl` file):
        JSON, for `fusee show` and `Replayer.replay_file` (docs/engine.md, *Exporting
        journals*). A finished run exports with its end, until its retention passes."""
        from fusee.engine.replay import export_document, whole

        described = await self.run(id).describe()
        if not whole(described.journal):
            raise NotFoundError(
                f"run '{id}' ({described.summary.status}) kept no whole journal to export",
                workflow_id=id,
            )
        return export_document(described.summary, described.journal)


def _check_policy(policy: dict[str, str] | None) -> None:
    allowed = {
        "running": ("fail", "use-existing", "terminate-existing"),
        "finished": ("allow", "allow-if-failed", "refuse", "use-existing"),
    }
    for key, value in (policy or {}).items():
        if key not in allowed or value not in allowed[key]:
            raise RejectedError(f"id_policy {key}={value!r}: allowed are {allowed}")


def _telemetry(telemetry: Any) -> Telemetry | None:
    if telemetry is None:
        return None
    if not hasattr(telemetry, "run_trace"):
        raise RejectedError(f"telemetry={telemetry!r}: expected fusee.open_telemetry() (or None)")
    return telemetry  # type: ignore[no-any-return]


def check_traceparent(value: Any) -> str:
    """A W3C traceparent header value (`00-<32 hex>-<16 hex>-<2 hex>`), refused otherwise
    before anything is recorded."""
    parts = value.split("-") if isinstance(value, str) else []
    if (
        [len(part) for part in parts] != [2, 32, 16, 2]
        or not all(_hex(part) for part in parts)
        or parts[0] == "ff"  # a version W3C reserves as invalid
        or parts[1] == "0" * 32
        or parts[2] == "0" * 16
    ):
        raise RejectedError(
            f"traceparent={value!r}: expected a W3C traceparent, 00-<trace id>-<span id>-<flags>"
        )
    return str(value)


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def delayed_until(now_ms: int, delay: Duration | None, at: datetime | int | float | None) -> int:
    """A start's `delay=` or `at=` as the Unix ms its code begins (0: at once)."""
    if delay is not None and at is not None:
        raise RejectedError("start: give delay= or at=, not both")
    due = now_ms + to_ms(delay, "delay") if delay is not None else at_ms(at, "at") if at is not None else 0
    return due if due > now_ms else 0  # a time already past starts at once, with no timer


def _seconds(value: float | None, what: str) -> None:
    """A deadline, grace or timeout in seconds: None, or a finite number from 0 (a bad one
    refused before anything is let go, not found half-way through a close)."""
    if value is None:
        return
    if type(value) not in (int, float) or not 0 <= value < float("inf"):
        raise RejectedError(f"{what}={value!r}: expected seconds, a finite number from 0 (or None)")
