"""`ctx`: everything workflow code may touch. Each call is a journal operation; the code
between calls must be deterministic (use `now`, `random` and `uuid` from here)."""

from __future__ import annotations

import inspect
import uuid as _uuid_module
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import msgspec

from fusee import _codec as codec
from fusee import _names as names
from fusee import journal as R
from fusee._errors import RejectedError
from fusee.workflow.definitions import (
    Query,
    Retry,
    Signal,
    Update,
    Workflow,
    query_of,
    signal_of,
    update_of,
)
from fusee.workflow.driver import current_step, inline_step
from fusee.workflow.durations import Duration, at_ms, to_ms
from fusee.workflow.objects import ObjectCalls, State
from fusee.workflow.ops import (
    AllOp,
    CancelOp,
    ChildOp,
    ContinueAsNew,
    DrawnOp,
    FiberOp,
    Op,
    RaceOp,
    SendOp,
    StepOp,
    TimerOp,
    WaitOp,
    WatchOp,
)

if TYPE_CHECKING:
    from fusee.workflow.driver import Driver


def step_key(run: Driver, op: StepOp) -> str:
    """The idempotency key: stable across retries and recovery, new for a new run."""
    return f"{run.wid}/{run.run_no}/{op.seq}"


ATTRIBUTES_BYTES_MAX = 16 << 10  # per call, encoded: attributes live in the index, in memory
_ATTRIBUTE_TYPES = (str, int, float, bool, type(None))


class StepContext:
    """What a step function may take as its one argument (built only when it does): its
    idempotency key, its attempt, whether it should give up (`cancelled`), and its
    progress (`heartbeat`, `progress`; docs/engine.md, *Heartbeats*)."""

    __slots__ = ("_beats", "attempt", "cancelled", "key", "step", "workflow_id")

    def __init__(
        self, key: str, attempt: int, workflow_id: str, step: str, beats: StepBeats | None = None
    ) -> None:
        self.key = key
        self.attempt = attempt
        self.workflow_id = workflow_id
        self.step = step
        self.cancelled = False
        self._beats = beats

    def heartbeat(self, progress: Any = None) -> None:
        """Say the attempt is alive, with how far it got. Returns at once: the latest
        progress is recorded with the next flush (never waited for). From a thread step
        too. Resets the step's `heartbeat_timeout`."""
        if self._beats is not None:
            self._beats.beat(self, codec.encode(progress, f"step '{self.step}' progress"))

    def stream(self, name: str) -> Any:
        """A stream of this step (or the run's stream of that name): `append(value)`,
        `close()`, and `recorded()`: what earlier attempts of the step appended, so this
        one continues after it. The step's result completes it."""
        if self._beats is None:
            raise RejectedError("s.stream: this step context has no engine behind it")
        return self._beats.stream(self, name)

    def progress(self) -> Any:
        """The latest progress this step reported: in this process the newest heartbeat
        of any of its attempts, after a crash or a handback the last durable one; None
        before any."""
        data = self._beats.progress() if self._beats is not None else None
        return None if data is None else codec.decode(data, Any, f"step '{self.step}' progress")

    def __repr__(self) -> str:
        return (
            f"StepContext(key={self.key!r}, attempt={self.attempt}, workflow_id={self.workflow_id!r}, "
            f"step={self.step!r}, cancelled={self.cancelled})"
        )


class StepBeats(Protocol):
    """Where a step context's heartbeats go (fusee/engine/heartbeats.py)."""

    def beat(self, context: StepContext, progress: bytes) -> None: ...
    def progress(self) -> bytes | None: ...
    def stream(self, context: StepContext, name: str) -> Any: ...


class Completion(msgspec.Struct):
    """What `await_completion`'s send function receives."""

    token: str
    url: str | None = None


class ChildHandle:
    """A started child: its ID, and its result as an operation."""

    __slots__ = ("_op", "_run", "id")

    def __init__(self, run: Driver, op: ChildOp) -> None:
        self._run = run
        self._op = op
        self.id = op.wid

    def result(self) -> Op:
        run, seq = self._run, self._op.seq
        watch = WatchOp(-1, f"child '{self.id}'")
        recorded = run.child_results.get(seq)
        if recorded is not None:
            run.resolve_child_watch(watch, recorded)
        else:
            run.child_watchers.setdefault(seq, []).append(watch)
        return watch


class Ctx:
    """The workflow context. Methods that return an `Op` must be awaited (directly or
    through `all`/`race`); `now`, `random`, `uuid` and `journal_size` return at once."""

    __slots__ = ("_run",)

    def __init__(self, run: Driver) -> None:
        self._run = run

    @property
    def workflow_id(self) -> str:
        return self._run.wid

    @property
    def run_number(self) -> int:
        return self._run.run_no

    @property
    def version(self) -> int:
        """The workflow version this run started with (`@fusee.workflow(version=)`, or a
        start's `version=`): recorded, so code can keep the old path for old runs."""
        return self._run.started.version

    def stream(self, name: str) -> Any:
        """A stream of the run (docs/engine.md, *Streams*): `append(value)` records a chunk
        and returns at once, `close()` completes it (the run's end does otherwise). Its
        readers (`run.stream(name, from_=)`) get each chunk once it is durable. On replay
        the appends are matched to the recorded ones and nothing is recorded again."""
        return self._run.stream(name)

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        """Search attributes for listings (`engine.list(where=...)`, docs/engine.md,
        *Search attributes*): merged over the ones set before; None removes one. Names
        are strings, values JSON; recorded plain (never encrypted), with no position."""
        if not isinstance(attributes, dict):
            raise RejectedError(f"set_attributes({attributes!r}): expected a dict of name to value")
        for name, value in attributes.items():
            names.name(name, "attribute name")
            if type(value) not in _ATTRIBUTE_TYPES:
                codec.encode(value, f"attribute {name!r}")  # JSON, or a CodecError naming the path
        if len(codec.encode(attributes, "attributes")) > ATTRIBUTES_BYTES_MAX:
            raise RejectedError(
                f"set_attributes: at most {ATTRIBUTES_BYTES_MAX:,} bytes of attributes per call"
            )
        self._run.set_attributes(dict(attributes))

    def traceparent(self) -> str | None:
        """The W3C traceparent the run's start recorded (None: it had none), so that a
        step can parent the spans of the calls it makes (docs/telemetry.md)."""
        traceparent: str | None = self._run.started.traceparent
        return traceparent

    # -- steps ------------------------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
        read_only: bool = False,
        thread: bool = False,
        output: Any = None,
        limit: str | None = None,
        priority: int = 0,
        fairness_key: str | None = None,
        fairness_weight: int = 1,
    ) -> StepOp:
        """Run `fn` once the records before it are durable, record its result, return it.
        On replay the recorded result comes back and `fn` does not run. With `limit=`,
        each attempt first takes a permit of that limit, waiting by `priority`, then in
        turns of `fairness_weight` by `fairness_key` (docs/limits.md). With
        `heartbeat_timeout=`, an attempt silent that long (no `s.heartbeat()`) fails with
        TimeoutError and is retried under `retry`."""
        run = self._run
        # The common case checked inline (this is every step's path); anything else goes
        # through the checks that name what is wrong.
        if type(name) is not str or not name.isascii() or not 0 < len(name) <= names.NAME_BYTES_MAX:
            names.name(name, "step name")
        if not callable(fn):
            _callable(fn, name)
        op = StepOp(
            -1,
            name,
            fn,
            run.default_retry if retry is None else _retry(retry, run),
            None if timeout is None else _timeout(timeout, f"step '{name}' timeout"),
            read_only,
            thread,
        )
        op.output = output
        if heartbeat_timeout is not None:
            op.heartbeat_ms = _timeout(heartbeat_timeout, f"step '{name}' heartbeat_timeout")
        if limit is not None:
            _limited(op, limit, priority, fairness_key, fairness_weight)
        run.issue(op)
        return op

    def await_completion(
        self,
        name: str,
        send: Callable[[Completion], Any],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        output: Any = None,
    ) -> StepOp:
        """Run `send(cb)` as a step (gated, retried), then wait until someone calls
        `engine.complete(cb.token, value)` or `engine.fail(cb.token, failure)`."""
        op = StepOp(
            -1,
            names.name(name, "await_completion name"),
            _callable(send, name),
            _retry(retry, self._run),
            _timeout(timeout, f"await_completion '{name}' timeout"),
            False,
            False,
            completion=True,
        )
        op.output = output
        self._run.issue(op)
        return op

    def compensate(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
    ) -> None:
        """Register a step that runs, newest first, if the workflow fails or is cancelled."""
        names.name(name, "compensation name")
        _callable(fn, name)
        options: dict[str, Any] = {}
        if retry is not None:
            options["retry"] = _retry(retry, self._run)
        if timeout is not None:
            _timeout(timeout, f"compensation '{name}' timeout")
            options["timeout"] = timeout
        self._run.compensations.append((name, fn, options))

    # -- time ---------------------------------------------------------------------------

    def sleep(self, name: str, duration: Duration) -> TimerOp:
        op = TimerOp(names.name(name, "sleep name"), to_ms(duration, f"sleep '{name}'"))
        return self._issue_timer(op)

    def sleep_until(self, name: str, at: datetime | int | float) -> TimerOp:
        return self._issue_timer(
            TimerOp(names.name(name, "sleep name"), None, at_ms(at, f"sleep_until '{name}'"))
        )

    def _issue_timer(self, op: TimerOp) -> TimerOp:
        run = self._run
        run.issue(op)
        rec = run.issued_record(op.seq)
        if isinstance(rec, R.TimerStarted):
            op.due, op.recorded = rec.due, True
        return op

    # -- signals ------------------------------------------------------------------------

    def wait_for(self, signal: Signal[Any] | str, *, timeout: Duration | None = None) -> WaitOp:
        """The signal's value; None if the timeout passed first. A signal that arrived
        before the code got here is kept and taken now."""
        sig = signal_of(signal)
        run = self._run
        names.name(sig.name, "signal name")
        op = WaitOp(
            sig.name,
            sig.type,
            to_ms(timeout, f"wait_for '{sig.name}' timeout") if timeout is not None else None,
        )
        run.issue(op)
        rec = run.issued_record(op.seq)
        if isinstance(rec, R.WaitStarted):
            op.due, op.recorded = rec.due, True
        run.take_signal(op)
        return op

    # -- values ---------------------------------------------------------------------------

    def now(self) -> datetime:
        """The time, recorded: the same on every replay."""
        ms = self._draw("now", lambda: self._run.now_ms())
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    def random(self) -> float:
        # Loaded on first use: `import fusee` is on an invoked function's cold path.
        import random as _random_module  # tidy: recorded (drawn live once, then replayed)

        return float(self._draw("random", _random_module.random))

    def uuid(self) -> _uuid_module.UUID:
        return _uuid_module.UUID(self._draw("uuid", lambda: str(_uuid_module.uuid4())))  # tidy: recorded

    def _draw(self, op_name: str, draw: Callable[[], Any]) -> Any:
        run = self._run
        op = run.issue(DrawnOp(-1, op_name))
        run.pending_start.remove(op)
        rec = run.issued_record(op.seq)
        if isinstance(rec, R.Drawn):
            value = rec.value
        else:
            value = draw()
            run.record(R.Drawn(op.seq, op_name, value))
        run.resolve(op, value)
        return value

    # -- patches ------------------------------------------------------------------------

    def patched(self, id: str) -> bool:
        """True where the run takes the new branch of change `id`: new runs, and running
        ones reaching this point for the first time since the deploy. False while a run
        replays a journal that went past this point before the patch existed. The choice
        is recorded as a marker with no journal position (docs/engine.md, *Patching*)."""
        return self._run.patched(_patch_id(id))

    def deprecate_patch(self, id: str) -> None:
        """Stands where `patched(id)` stood once no run predates the patch: the code keeps
        only the new branch; the marker is still recorded, so a rollback to the code with
        `patched(id)` sends the runs started meanwhile down the branch they took."""
        self._run.patched(_patch_id(id))

    def journal_size(self) -> int:
        """Operations the run has called so far; deterministic."""
        return self._run.next_seq

    def key(self) -> str:
        """The idempotency key of the step whose function is running."""
        here = inline_step[0] or current_step.get()
        if here is None or here[0] is not self._run:
            raise RejectedError(
                "key() called outside a step's function: there is no step to key. Call it "
                "inside the step's function, or take the step context and use s.key"
            )
        return step_key(*here)

    # -- combinators ----------------------------------------------------------------------

    def all(self, ops: Sequence[Awaitable[Any]]) -> Op:
        """Every operation's result, in order; the first failure raises."""
        items = [_as_op(op) for op in ops]
        return self._run.combine(AllOp(items), items)

    def race(self, ops: Sequence[Awaitable[Any]]) -> Op:
        """The first operation to finish, its result or its failure."""
        items = [_as_op(op) for op in ops]
        return self._run.combine(RaceOp(items), items)

    # -- other workflows --------------------------------------------------------------

    def start_child(
        self,
        workflow: Workflow[Any] | str,
        id: str,
        input: Any = None,
        *,
        parent_close: str = "terminate",
        timeout: Duration | None = None,
    ) -> ChildOp:
        """Start a child workflow (on whatever shard its ID hashes to); resolves to a
        `ChildHandle` once the child's shard started it."""
        if parent_close not in ("terminate", "request-cancel", "abandon"):
            raise RejectedError(f"parent_close {parent_close!r}: use terminate, request-cancel or abandon")
        names.name(id, "child workflow ID")
        name, in_type, out_type = _types_of(workflow, self._run)
        data, _ = codec.convert(input, in_type, f"child '{id}' input")
        timeout_ms = to_ms(timeout, f"child '{id}' timeout") if timeout is not None else 0
        op = ChildOp(id, name, out_type, data, parent_close, timeout_ms)
        run = self._run
        run.issue(op)
        if isinstance(run.issued_record(op.seq), R.ChildRequested):
            op.recorded = True
        return op

    async def child(
        self,
        workflow: Workflow[Any] | str,
        id: str,
        input: Any = None,
        *,
        parent_close: str = "terminate",
        timeout: Duration | None = None,
    ) -> Any:
        """Start a child and wait for its result."""
        handle = await self.start_child(workflow, id, input, parent_close=parent_close, timeout=timeout)
        return await handle.result()

    def signal_workflow(self, id: str, signal: Signal[Any] | str, value: Any = None) -> SendOp:
        sig = signal_of(signal)
        names.name(id, "signal_workflow target ID")
        names.name(sig.name, "signal name")
        op = SendOp(id, sig.name, codec.convert(value, sig.type, f"signal '{sig.name}'")[0])
        return self._issue_send(op, R.SignalSent)

    def cancel_workflow(self, id: str, reason: str | None = None) -> SendOp:
        names.name(id, "cancel_workflow target ID")
        return self._issue_send(CancelOp(id, id, names.text(reason, "cancel reason")), R.CancelSent)

    def _issue_send(self, op: SendOp, kind: type) -> SendOp:
        run = self._run
        run.issue(op)
        if isinstance(run.issued_record(op.seq), kind):
            op.recorded = True
        return op

    def object(self, type: str, key: str) -> ObjectCalls:
        """Calls to an object's key (docs/objects.md): `call(handler, arg)` waits for the
        handler's result, `send(handler, arg)` returns at once; both run exactly once."""
        return ObjectCalls(self, type, key)

    # -- queries and updates ------------------------------------------------------------

    def on_query(self, query: Query[Any, Any] | str, handler: Callable[[Any], Any]) -> None:
        q = query_of(query)
        names.name(q.name, "query name")
        self._run.query_handlers[q.name] = (q, _callable(handler, q.name))

    def on_update(
        self,
        update: Update[Any, Any] | str,
        handler: Callable[[Any], Any],
        validate: Callable[[Any], Any] | None = None,
    ) -> None:
        """Register an update's handler (sync or async; async ones may call ctx) and its
        validator, which refuses by raising or by returning a message."""
        u = update_of(update)
        names.name(u.name, "update name")
        run = self._run
        run.update_handlers[u.name] = (u, _callable(handler, u.name), validate)
        for rec in run.pending_updates.pop(u.name, []):
            run.start_update(rec)

    # -- the run's end ------------------------------------------------------------------

    def continue_as_new(self, input: Any = None, *, version: int | None = None) -> NoReturn:
        """End this run and start the next run of the same ID with `input`."""
        wf = self._run.workflow
        assert wf is not None
        data, _ = codec.convert(input, wf.input_type, "continue_as_new input")
        raise ContinueAsNew(data, version or wf.version)


def _callable(fn: Any, name: str) -> Any:
    if not callable(fn):
        raise RejectedError(f"'{name}': expected a function, got {type(fn).__name__}")
    return fn


def _limited(op: StepOp, limit: str, priority: int, key: str | None, weight: int) -> None:
    """A step's limit options, checked where the code calls `ctx.step` (the call names
    what is wrong, not a grant much later)."""
    names.name(limit, "step limit")
    if type(priority) is not int or not -(1 << 31) <= priority < 1 << 31:
        raise RejectedError(f"step '{op.name}': priority={priority!r}: expected a 32-bit int")
    if key is not None and type(key) is not str:
        raise RejectedError(f"step '{op.name}': fairness_key={key!r}: expected a str (or None)")
    if type(weight) is not int or weight < 1:
        raise RejectedError(f"step '{op.name}': fairness_weight={weight!r}: expected a positive int")
    op.limit, op.priority, op.fairness_key, op.fairness_weight = limit, priority, key, weight


def _retry(retry: Any, run: Driver) -> Retry:
    """The engine's default policy unless the call gives one (a step, a completion and a
    compensation alike)."""
    if retry is None:
        default: Retry = run.default_retry
        return default
    if not isinstance(retry, Retry):
        raise RejectedError(f"retry: expected a fusee.Retry, got {type(retry).__name__}")
    return retry


def _timeout(timeout: Duration | None, what: str) -> int | None:
    """An attempt's timeout: positive (a zero timeout would fail every attempt before it
    began, on one storage sooner than on another)."""
    if timeout is None:
        return None
    ms = to_ms(timeout, what)
    if ms <= 0:
        raise RejectedError(f"{what}: {timeout!r} must be more than 0")
    return ms


def _as_op(item: Awaitable[Any]) -> Op:
    if isinstance(item, Op):
        return item
    if inspect.iscoroutine(item):
        return FiberOp(item)
    raise TypeError(f"all/race take ctx operations or coroutines, not {type(item).__name__}")


def _types_of(workflow: Workflow[Any] | str, run: Driver) -> tuple[str, Any, Any]:
    if isinstance(workflow, str):
        known = run.workflow_named(workflow)
        if known is None:
            return workflow, Any, Any
        workflow = known
    return workflow.name, workflow.input_type, workflow.output_type


def takes_context(fn: Callable[..., Any], _cache: dict[Any, bool] = {}) -> bool:  # noqa: B006
    """Whether a step function declares the step context parameter (cached per code)."""
    code = getattr(fn, "__code__", fn)
    try:
        return _cache[code]
    except KeyError:
        pass
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        takes = len(params) >= 1
    except (TypeError, ValueError):
        takes = False
    _cache[code] = takes
    return takes


def _patch_id(id: Any) -> str:
    if not isinstance(id, str) or not id:
        raise RejectedError(f"a patch ID is a non-empty string, not {id!r}")
    return id


class ObjectCtx(Ctx):
    """An object handler's `ctx` (docs/objects.md): the key's run's workflow context, plus
    the key's `state` as this handler sees it, `object_key` and `object_type`."""

    __slots__ = ("object_key", "object_type", "state")

    def __init__(self, run: Driver, type_name: str, key: str, state: State) -> None:
        super().__init__(run)
        self.object_type = type_name
        self.object_key = key
        self.state = state
