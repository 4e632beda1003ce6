"""The run as workflow code's `ctx` sees it: what `ctx` asks of the engine that drives it.

The engine's run (`fusee.engine.run.RunState`) is the one implementation; this protocol is
what keeps `fusee.workflow` from importing the engine (imports point one way: the engine
uses the workflow layer, never the reverse). With it, the slots that say which step's
function runs now, and in which run (`ctx.key()` reads them; the engine sets them).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fusee import journal as R
    from fusee.workflow.definitions import Retry, Workflow
    from fusee.workflow.ops import Op, StepOp, WaitOp, WatchOp


class Driver(Protocol):
    wid: str
    run_no: int
    started: R.Started
    workflow: Workflow[Any] | None
    next_seq: int
    pending_start: list[Op]
    compensations: list[tuple[str, Callable[..., Any], dict[str, Any]]]
    child_results: dict[int, R.ChildResult]
    child_watchers: dict[int, list[WatchOp]]
    query_handlers: dict[str, tuple[Any, Callable[..., Any]]]
    update_handlers: dict[str, tuple[Any, Callable[..., Any], Callable[..., Any] | None]]
    pending_updates: dict[str, list[R.UpdateAccepted]]
    default_retry: Retry

    def issue(self, op: Op) -> Op:
        """Give an operation its journal position, check it on replay, start it live."""

    def issued_record(self, seq: int) -> R.Rec | None:
        """On replay, the record the journal holds for operation `seq` (live: None)."""

    def record(self, rec: R.Rec) -> None: ...

    def stream(self, name: str) -> Any:
        """`ctx.stream`: a writer of the run's stream (fusee/engine/streams.py)."""

    def set_attributes(self, changes: dict[str, Any]) -> None:
        """Search attributes (docs/engine.md, *Search attributes*)."""

    def patched(self, patch: str) -> bool:
        """Whether the run takes a patch's new branch (docs/engine.md, *Patching*)."""

    def resolve(self, op: Op, value: Any = None, exc: BaseException | None = None) -> None: ...

    def combine(self, combined: Op, ops: list[Op]) -> Op:
        """`all`/`race`: an operation that resolves from the ones it combines."""

    def take_signal(self, op: WaitOp) -> None:
        """A signal buffered before the code waited for it."""

    def resolve_child_watch(self, watch: WatchOp, rec: R.ChildResult) -> None: ...

    def start_update(self, rec: R.UpdateAccepted) -> None: ...

    def now_ms(self) -> int: ...

    def workflow_named(self, name: str) -> Workflow[Any] | None: ...

    def objects(self) -> Any:
        """What `ctx.object(...).call` steps send through (fusee/engine/objects/)."""


# The step whose function runs: a context variable for step functions on tasks and
# threads, a plain slot for synchronous ones (they run on the loop, one at a time).
current_step: contextvars.ContextVar[tuple[Driver, StepOp] | None] = contextvars.ContextVar(
    "fusee_step", default=None
)
inline_step: list[tuple[Driver, StepOp] | None] = [None]
