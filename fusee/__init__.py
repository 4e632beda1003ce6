"""Fusee: durable workflows in plain async Python."""

from typing import TYPE_CHECKING, Any

from fusee._audit import as_requester
from fusee._clock import SystemClock, VirtualClock
from fusee._errors import (
    AlreadyExistsError,
    BusyError,
    CancelledError,
    ChildError,
    ClosedError,
    CodecError,
    ConnectionError,
    DeterminismError,
    Failure,
    Fatal,
    FuseeError,
    IoError,
    LeaseLostError,
    NoHolderError,
    NotFoundError,
    RejectedError,
    StaleVersionError,
    StepError,
    TerminatedError,
    TimeoutError,
    UnknownWorkflowError,
    WorkflowError,
)
from fusee._sealing import AesGcm, aes_gcm
from fusee.engine.engine import Engine
from fusee.engine.objects import ObjectRef
from fusee.engine.run_handle import Run, RunDescription, RunSummary
from fusee.engine.schedules import ScheduleHandle, ScheduleSpec
from fusee.engine.schedules import flow as _schedule_flow
from fusee.storage import Durability
from fusee.workflow.ctx import ChildHandle, Completion, Ctx, ObjectCtx, StepContext
from fusee.workflow.definitions import (
    Concurrency,
    Query,
    Retry,
    Signal,
    Update,
    Workflow,
    query,
    signal,
    update,
    workflow,
)
from fusee.workflow.objects import ObjectType, State, object, shared

if TYPE_CHECKING:  # loaded on first use (module __getattr__ below): not on a cold path
    from fusee.client import Client
    from fusee.engine.replay import Replayer
    from fusee.engine.telemetry import open_telemetry
    from fusee.invoke import invocation_handler

__version__ = "0.1.0"

__all__ = [
    "AesGcm",
    "AlreadyExistsError",
    "BusyError",
    "CancelledError",
    "ChildError",
    "ChildHandle",
    "Client",
    "ClosedError",
    "CodecError",
    "Completion",
    "Concurrency",
    "ConnectionError",
    "Ctx",
    "DeterminismError",
    "Durability",
    "Engine",
    "Failure",
    "Fatal",
    "FuseeError",
    "IoError",
    "LeaseLostError",
    "NoHolderError",
    "NotFoundError",
    "ObjectCtx",
    "ObjectRef",
    "ObjectType",
    "Query",
    "RejectedError",
    "Replayer",
    "Retry",
    "Run",
    "RunDescription",
    "RunSummary",
    "ScheduleHandle",
    "ScheduleSpec",
    "Signal",
    "StaleVersionError",
    "State",
    "StepContext",
    "StepError",
    "SystemClock",
    "TerminatedError",
    "TimeoutError",
    "UnknownWorkflowError",
    "Update",
    "VirtualClock",
    "Workflow",
    "WorkflowError",
    "aes_gcm",
    "as_requester",
    "invocation_handler",
    "object",
    "open_telemetry",
    "query",
    "shared",
    "signal",
    "update",
    "workflow",
]


async def _schedule_client(address: Any) -> Any:
    # A worker's schedules reach runs on any shard through a client of its server; the
    # engine package may not import the client's, so the way is handed to it from here.
    from fusee.client import Client

    return await Client.at(address)


_schedule_flow.connect_client = _schedule_client


def __getattr__(name: str) -> Any:
    # The client loads the wire (and ssl) only when asked for: not on a worker's cold path.
    if name == "Client":
        from fusee.client import Client

        return Client
    if name == "invocation_handler":
        from fusee.invoke import invocation_handler

        return invocation_handler
    if name == "open_telemetry":  # imports opentelemetry: only for those who turn it on
        from fusee.engine.telemetry import open_telemetry

        return open_telemetry
    if name == "Replayer":  # a debugging tool: no worker's boot needs it
        from fusee.engine.replay import Replayer

        return Replayer
    raise AttributeError(f"module 'fusee' has no attribute {name!r}")
