"""Operations: the awaitables `ctx` hands to workflow code.

Awaiting an unresolved operation yields it to the run's driver, which resumes the code
once the operation resolves (from the journal on replay, from execution live). Nothing
here touches asyncio: workflow code runs under the run's own deterministic scheduler.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusee.workflow.definitions import Retry


class ContinueAsNew(BaseException):
    """Unwinds workflow code that called `ctx.continue_as_new`."""

    def __init__(self, input: bytes, version: int) -> None:
        self.input = input
        self.version = version


class Fiber:
    """One coroutine of the run: the workflow's main code, an update handler, or a
    coroutine given to `all`/`race`."""

    __slots__ = ("coro", "on_done")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], on_done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self.coro = coro
        self.on_done = on_done


class StepState(enum.Enum):
    """Where a step's attempt stands (whether it finished is `Op.done`, as for any op)."""

    IDLE = "idle"  # not begun, or between attempts (`retry_at` says until when)
    RUNNING = "running"  # its function runs, or waits for the records before it to be durable
    SENT = "sent"  # an async completion whose token is out: it waits for `complete`/`fail`
    PAUSED = "paused"  # out of retries under on_exhausted="pause": waits for `resume()`


class Op:
    """An operation the code called. `seq` is its journal position (-1: takes none)."""

    __slots__ = ("done", "exc", "name", "recorded", "seq", "value", "waiters")
    kind = "op"

    def __init__(self, seq: int, name: str) -> None:
        self.seq = seq
        self.name = name
        self.done = False
        self.value: Any = None
        self.exc: BaseException | None = None
        self.waiters: list[Fiber | Op] = []
        self.recorded = False  # its issued record is in the journal (live, or replayed)

    def __await__(self) -> Generator[Op, None, Any]:
        if not self.done:
            yield self
        if self.exc is not None:
            raise self.exc
        return self.value

    @property
    def ident(self) -> str:
        """What replay compares, with the kind, against the journal at this position."""
        return self.name

    def child_done(self, child: Op) -> None:
        """Called when an operation this one combines resolves."""


class StepOp(Op):
    """A step, or an async completion (its send function runs as a step)."""

    __slots__ = (
        "asking",
        "attempt",
        "attempts_before",
        "awaitable",
        "beat",
        "completion",
        "context",
        "fairness_key",
        "fairness_weight",
        "first_failure_at",
        "fn",
        "heartbeat_ms",
        "limit",
        "output",
        "permit",
        "priority",
        "progress",
        "read_only",
        "retry",
        "retry_at",
        "state",
        "task",
        "thread",
        "timeout_ms",
    )

    def __init__(
        self,
        seq: int,
        name: str,
        fn: Callable[..., Any],
        retry: Retry,
        timeout_ms: int | None,
        read_only: bool,
        thread: bool,
        completion: bool = False,
    ) -> None:
        super().__init__(seq, name)
        self.fn = fn
        self.retry = retry
        self.timeout_ms = timeout_ms
        self.read_only = read_only
        self.thread = thread
        self.attempt = 1  # what the step function sees: from 1 again after a resume
        self.attempts_before = 0  # the attempts made before the last resume (the journal numbers on)
        self.first_failure_at = 0
        self.retry_at = 0
        self.task: Any = None
        self.awaitable: Any = None  # what the task awaits: the function's coroutine
        self.state = StepState.IDLE
        # An async completion: the step's function sends the token, then the op waits
        # for `complete`/`fail` (SENT once CompletionSent is recorded).
        self.completion = completion
        self.output: Any = None
        self.context: Any = None  # the StepContext of the attempt running, if it takes one
        # Heartbeats (fusee/engine/heartbeats.py): the latest progress (from the journal,
        # or newer from this process), the attempt's bound on silence, and its beat state.
        self.progress: bytes | None = None
        self.heartbeat_ms: int | None = None
        self.beat: Any = None
        # A limit's permit is taken before each attempt and returned when it ends
        # (docs/limits.md); None: no limit. Not journaled: the order of waiters is not.
        self.limit: str | None = None
        self.priority = 0
        self.fairness_key: str | None = None
        self.fairness_weight = 1
        self.permit: Any = None  # held while an attempt runs
        # Waiting for its permit at the server (server mode): the server wakes the shard
        # when it is granted, so the shard may be let go of meanwhile (docs/limits.md).
        self.asking = False

    @property
    def kind(self) -> str:  # type: ignore[override]
        return "await_completion" if self.completion else "step"


class DrawnOp(Op):
    """`now`, `random`, `uuid`: resolved at once, its value recorded."""

    __slots__ = ()

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.name


class TimerOp(Op):
    __slots__ = ("due", "duration_ms")
    kind = "sleep"

    def __init__(self, name: str, duration_ms: int | None, due: int = 0) -> None:
        super().__init__(-1, name)
        self.duration_ms = duration_ms  # None: sleep_until, `due` given
        self.due = due


class WaitOp(Op):
    """`wait_for`: resolved by a signal of its name, or by its timeout (to None)."""

    __slots__ = ("due", "orphaned", "timeout_ms", "type")
    kind = "wait_for"

    def __init__(self, name: str, type_: Any, timeout_ms: int | None) -> None:
        super().__init__(-1, name)
        self.type = type_
        self.due = 0
        self.timeout_ms = timeout_ms
        self.orphaned = False  # lost a race: takes no signal until awaited again


class ChildOp(Op):
    """`start_child`: resolves once the child's shard started (or refused) the child."""

    __slots__ = ("close", "input", "result_type", "timeout_ms", "wid", "workflow")
    kind = "child"

    def __init__(
        self, wid: str, workflow: str, result_type: Any, input: bytes, close: str, timeout_ms: int
    ) -> None:
        super().__init__(-1, wid)
        self.wid = wid
        self.workflow = workflow
        self.result_type = result_type
        self.input = input
        self.close = close
        self.timeout_ms = timeout_ms

    @property
    def ident(self) -> str:
        return f"{self.workflow} {self.wid}"


class SendOp(Op):
    """`signal_workflow` / `cancel_workflow`: resolves once the target answered."""

    __slots__ = ("payload", "target")
    kind = "signal_workflow"

    def __init__(self, target: str, name: str, payload: Any) -> None:
        super().__init__(-1, name)
        self.target = target
        self.payload = payload

    @property
    def ident(self) -> str:
        return f"{self.name} to {self.target}"


class CancelOp(SendOp):
    __slots__ = ()
    kind = "cancel_workflow"

    @property
    def ident(self) -> str:
        return self.target


class WatchOp(Op):
    """Waits for a state of the run (a child's result); takes no journal position."""

    __slots__ = ()
    kind = "watch"


class AllOp(Op):
    __slots__ = ("left", "ops")
    kind = "all"

    def __init__(self, ops: list[Op]) -> None:
        super().__init__(-1, "all")
        self.ops = ops
        self.left = sum(1 for op in ops if not op.done)

    def child_done(self, child: Op) -> None:
        if self.done:
            return
        if child.exc is not None:
            self.exc = child.exc
            self.done = True
            return
        self.left -= 1
        if self.left == 0:
            self.value = [op.value for op in self.ops]
            self.done = True


class RaceOp(Op):
    __slots__ = ("ops",)
    kind = "race"

    def __init__(self, ops: list[Op]) -> None:
        super().__init__(-1, "race")
        self.ops = ops

    def child_done(self, child: Op) -> None:
        if not self.done:
            self.value, self.exc, self.done = child.value, child.exc, True


class FiberOp(Op):
    """A coroutine passed to `all`/`race`, run as a fiber of its own."""

    __slots__ = ("coro",)
    kind = "fiber"

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        super().__init__(-1, getattr(coro, "__qualname__", "coroutine"))
        self.coro = coro
