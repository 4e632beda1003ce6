"""Fusee: durable workflows in plain async Python."""

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
    StepError,
    TerminatedError,
    TimeoutError,
    UnknownWorkflowError,
    WorkflowError,
)
from fusee.engine.engine import Engine
from fusee.engine.handle import Run, RunDescription, RunSummary
from fusee.engine.replay import Replayer
from fusee.storage import Durability
from fusee.workflow.ctx import ChildHandle, Completion, Ctx, StepContext
from fusee.workflow.definitions import (
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

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "BusyError",
    "CancelledError",
    "ChildError",
    "ChildHandle",
    "Client",
    "ClosedError",
    "CodecError",
    "Completion",
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
    "Query",
    "RejectedError",
    "Replayer",
    "Retry",
    "Run",
    "RunDescription",
    "RunSummary",
    "Signal",
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
    "query",
    "signal",
    "update",
    "workflow",
]


def __getattr__(name: str) -> object:
    # The client loads the wire (and ssl) only when asked for: not on a worker's cold path.
    if name == "Client":
        from fusee.client import Client

        return Client
    raise AttributeError(f"module 'fusee' has no attribute {name!r}")
