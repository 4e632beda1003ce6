"""Definitions: workflows, signals, queries and updates, plain values made apart from any
engine so a client can import them for their names and types alone."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import msgspec

from fusee import _names as names
from fusee._errors import RejectedError
from fusee.workflow.durations import Duration, to_ms

In = TypeVar("In")
Out = TypeVar("Out")
WorkflowFn = Callable[..., Awaitable[Any]]


class Concurrency:
    """Runs at once: at most `limit` runs of the type (of each `key(input)`, with `key=`)
    run at a time; starts from outside a workflow wait their turn in start order
    (docs/coordinators.md)."""

    __slots__ = ("key", "limit")

    def __init__(self, limit: int, key: Callable[[Any], str] | None = None) -> None:
        if type(limit) is not int or not 0 < limit < 1 << 31:
            raise RejectedError(f"Concurrency({limit!r}): expected a positive int")
        if key is not None and not callable(key):
            raise RejectedError("Concurrency(key=): expected a function of the input")
        self.limit = limit
        self.key = key

    def __repr__(self) -> str:
        return f"fusee.Concurrency({self.limit}{', key=...' if self.key else ''})"


class Workflow(Generic[Out]):
    """A workflow type: its name, version, code and the input and result types read once
    from the function's annotations."""

    __slots__ = (
        "compact_update",
        "concurrency",
        "fn",
        "input_type",
        "name",
        "output_type",
        "takes_input",
        "timeout_ms",
        "version",
    )

    def __init__(
        self,
        fn: WorkflowFn,
        name: str | None = None,
        version: int = 1,
        timeout: Duration | None = None,
        input: Any = None,
        output: Any = None,
        concurrency: Concurrency | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"workflow '{name or fn.__name__}' must be an `async def` function")
        params, hints = _shape(fn)
        if not params or len(params) > 2:
            raise TypeError(
                f"workflow '{name or fn.__name__}' must take (ctx) or (ctx, input), "
                f"not {len(params)} parameters"
            )
        self.fn = fn
        self.name = names.name(name or fn.__name__, "workflow type name")
        if type(version) is not int or not 0 < version < 1 << 31:
            raise RejectedError(f"workflow '{self.name}': version={version!r}, expected a positive int")
        self.version = version
        self.timeout_ms = to_ms(timeout, "timeout") if timeout is not None else None
        self.takes_input = len(params) == 2
        self.input_type = (
            input if input is not None else (hints.get(params[1].name, Any) if self.takes_input else Any)
        )
        self.output_type = output if output is not None else hints.get("return", Any)
        if concurrency is not None and not isinstance(concurrency, Concurrency):
            raise RejectedError(f"workflow '{self.name}': concurrency= takes a fusee.Concurrency")
        self.concurrency = concurrency
        # The update a shard sends the run instead of parking it once its journal has grown
        # past its start: an object's key compacts before it parks (docs/objects.md).
        self.compact_update: str | None = None

    def __repr__(self) -> str:
        return f"<fusee.Workflow {self.name!r} v{self.version}>"

    async def __call__(self, ctx: Any, *args: Any) -> Out:
        """Calls the code directly (as a plain coroutine), e.g. from a test."""
        result: Out = await self.fn(ctx, *args)
        return result


_SHAPES: dict[tuple[Any, ...], tuple[list[inspect.Parameter], dict[str, Any]]] = {}
_SHAPES_MAX = 256


def _shape(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """`fn`'s parameters and resolved annotations. Built-in workflows (schedules, the
    coordinators) are closures made again for every engine, and an invoked handler opens
    an engine per invocation: reading their annotations (a compile per string annotation)
    was most of an engine's open. Kept per code object when nothing else can change the
    answer: a plain function whose annotations are all strings (resolved in the code's
    module), no defaults read (only the parameters' names and count are used)."""
    annotations = getattr(fn, "__annotations__", None)
    key = None
    plain = not hasattr(fn, "__wrapped__") and not hasattr(fn, "__signature__")
    if type(fn) is types.FunctionType and plain and isinstance(annotations, dict):
        items = tuple(annotations.items())
        if all(type(value) is str for _, value in items):
            key = (fn.__code__, id(fn.__globals__), items)
            found = _SHAPES.get(key)
            if found is not None:
                return found
    shape = list(inspect.signature(fn).parameters.values()), _hints(fn)
    if key is not None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[key] = shape
    return shape


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations mean: untyped JSON
        return {}


@overload
def workflow(fn: WorkflowFn, /) -> Workflow[Any]: ...
@overload
def workflow(
    name: str | None = None,
    /,
    *,
    version: int = 1,
    timeout: Duration | None = None,
    input: Any = None,
    output: Any = None,
    concurrency: Concurrency | None = None,
) -> Callable[[WorkflowFn], Workflow[Any]]: ...


def workflow(
    name_or_fn: str | WorkflowFn | None = None,
    /,
    *,
    version: int = 1,
    timeout: Duration | None = None,
    input: Any = None,
    output: Any = None,
    concurrency: Concurrency | None = None,
) -> Workflow[Any] | Callable[[WorkflowFn], Workflow[Any]]:
    """Define a workflow type: `@fusee.workflow`, or `@fusee.workflow("name", version=2)`."""
    if callable(name_or_fn):
        return Workflow(name_or_fn)

    def define(fn: WorkflowFn) -> Workflow[Any]:
        return Workflow(fn, name_or_fn, version, timeout, input, output, concurrency)

    return define


class Signal(msgspec.Struct, Generic[In], frozen=True):
    """A signal's name and payload type."""

    name: str
    type: Any = Any


class Query(msgspec.Struct, Generic[In, Out], frozen=True):
    """A query's name, argument and result types."""

    name: str
    arg: Any = Any
    result: Any = Any


class Update(msgspec.Struct, Generic[In, Out], frozen=True):
    """An update's name, argument and result types."""

    name: str
    arg: Any = Any
    result: Any = Any


def signal(name: str, type: Any = Any) -> Signal[Any]:
    return Signal(name, type)


def query(name: str, arg: Any = Any, result: Any = Any) -> Query[Any, Any]:
    return Query(name, arg, result)


def update(name: str, arg: Any = Any, result: Any = Any) -> Update[Any, Any]:
    return Update(name, arg, result)


def signal_of(sig: Signal[Any] | str) -> Signal[Any]:
    """A plain string works wherever a definition does."""
    return Signal(sig) if isinstance(sig, str) else sig


def query_of(q: Query[Any, Any] | str) -> Query[Any, Any]:
    return Query(q) if isinstance(q, str) else q


def update_of(u: Update[Any, Any] | str) -> Update[Any, Any]:
    return Update(u) if isinstance(u, str) else u


class Retry(msgspec.Struct, frozen=True):
    """A step's retry policy. The default: 3 attempts, ~100 ms then ~200 ms apart, each
    delay drawn between half of it and all of it so runs that fail together do not retry
    together. A failure is final when it is a `fusee.Fatal`, has `retryable = False`, its
    type (or a cause's) is in `non_retryable`, or `retry_if(failure, attempt)` says no."""

    attempts: int = 3
    initial: Duration = 100
    factor: float = 2.0
    max: Duration = "10s"
    jitter: bool = True
    max_elapsed: Duration | None = None
    non_retryable: Sequence[type[BaseException] | str] = ()
    retry_if: Callable[[Any, int], bool] | None = None
    # What a retryable failure does once the attempts (or `max_elapsed`) run out: "fail"
    # the step, or "pause" the run until `run.resume()`; None takes the engine's
    # `Engine.open(on_exhausted=)`, which defaults to "fail".
    on_exhausted: str | None = None

    def __post_init__(self) -> None:
        # Checked when the policy is made, not when a step fails: a bad policy found at a
        # retry would fail inside the engine, after the failure was already recorded.
        if type(self.attempts) is not int or self.attempts < 1:
            raise RejectedError(f"Retry(attempts={self.attempts!r}): expected an int of at least 1")
        if not isinstance(self.factor, (int, float)) or not 1 <= self.factor <= 1000:
            raise RejectedError(f"Retry(factor={self.factor!r}): expected a number from 1 to 1000")
        to_ms(self.initial, "Retry(initial=)")
        to_ms(self.max, "Retry(max=)")
        if self.max_elapsed is not None:
            to_ms(self.max_elapsed, "Retry(max_elapsed=)")
        if self.retry_if is not None and not callable(self.retry_if):
            raise RejectedError("Retry(retry_if=): expected a function of (failure, attempt)")
        if self.on_exhausted is not None:
            check_on_exhausted(self.on_exhausted, "Retry(on_exhausted=)")

    def delay_ms(self, attempt: int, draw: float) -> int:
        """The wait after failed attempt `attempt` (1-based); `draw` is in [0, 1)."""
        cap = to_ms(self.max)
        try:
            base = min(to_ms(self.initial) * self.factor ** (attempt - 1), cap)
        except OverflowError:  # a factor raised to a large attempt number
            base = cap
        return int(base * (0.5 + 0.5 * draw)) if self.jitter else int(base)


DEFAULT_RETRY = Retry()
ON_EXHAUSTED = ("fail", "pause")


def check_on_exhausted(value: Any, where: str) -> str:
    """`on_exhausted=` as given to a Retry or to Engine.open: "fail" or "pause"."""
    if value not in ON_EXHAUSTED:
        raise RejectedError(f"{where}: {value!r} is not a choice; expected 'fail' or 'pause'")
    return str(value)
