"""Fusee: durable workflows in plain async Python."""

from fusee._clock import SystemClock, VirtualClock
from fusee._ctx import ChildHandle, Completion, Ctx, StepContext
from fusee._definitions import (
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
from fusee._engine import Engine
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
    NotFoundError,
    RejectedError,
    StepError,
    TerminatedError,
    TimeoutError,
    UnknownWorkflowError,
    WorkflowError,
)
from fusee._handle import Run, RunDescription, RunSummary
from fusee._replay import Replayer
from fusee._storage import Durability

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "BusyError",
    "CancelledError",
    "ChildError",
    "ChildHandle",
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
