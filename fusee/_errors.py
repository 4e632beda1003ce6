"""Fusee's errors and the failure envelope.

Every error carries its `code` and `docs`, a link to its section of the error reference
(docs/errors.md). A failure raised by application code travels as a `Failure` envelope so its
type, code, details and cause survive the journal and any number of nesting levels.
"""

from __future__ import annotations

import traceback
from typing import Any

import msgspec

DOCS = "docs/errors.md#"  # the section of this repository's docs/errors.md
STACK_BYTES_MAX = 4096


class Failure(msgspec.Struct, omit_defaults=True):
    """A recorded failure: what a failed step, update or workflow leaves in the journal."""

    message: str
    type: str | None = None
    code: str | None = None
    details: Any = None
    retryable: bool | None = None
    stack: str | None = None
    cause: Failure | None = None


class FuseeError(Exception):
    """Base of every error Fusee raises; `code` is the same in every SDK."""

    code = "Fusee"

    def __init__(self, message: str, **ids: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in ids.items():
            setattr(self, key, value)

    @property
    def docs(self) -> str:
        return DOCS + self.code.lower()


class NotFoundError(FuseeError):
    code = "NotFound"


class AlreadyExistsError(FuseeError):
    code = "AlreadyExists"


class UnknownWorkflowError(FuseeError):
    code = "UnknownWorkflow"


class RejectedError(FuseeError):
    code = "Rejected"


class StaleVersionError(RejectedError):
    """An edit of an object's state with `if_version` that no longer holds: the state
    changed since that version was read (HTTP 412)."""

    code = "StaleVersion"


class CodecError(FuseeError):
    code = "Codec"
    retryable = False


class DeterminismError(FuseeError):
    code = "Determinism"


class ClosedError(FuseeError):
    code = "Closed"


class BusyError(FuseeError):
    code = "Busy"


class IoError(FuseeError):
    code = "Io"


class ConnectionError(FuseeError):
    code = "Connection"


class LeaseLostError(FuseeError):
    """The engine no longer holds the shard: its lease went to another holder, or the
    shard was detached or stopped. Nothing more is recorded there by this engine; retry
    the call (it goes to the shard's next holder)."""

    code = "LeaseLost"


class NoHolderError(FuseeError):
    """A client's call for a shard no worker holds now (server mode): retry once a
    worker holds it."""

    code = "NoHolder"


class _FailureError(FuseeError):
    """An error that wraps a recorded failure as its `cause`."""

    def __init__(self, message: str, cause: Failure | None = None, **ids: Any) -> None:
        super().__init__(message, **ids)
        self.cause = cause


class StepError(_FailureError):
    code = "StepFailed"

    def __init__(self, step: str, cause: Failure) -> None:
        super().__init__(f"step '{step}' failed: {cause.message}", cause, step=step)


class WorkflowError(_FailureError):
    code = "WorkflowFailed"

    def __init__(self, cause: Failure) -> None:
        super().__init__(f"workflow failed: {cause.message}", cause)


class ChildError(_FailureError):
    code = "ChildFailed"

    def __init__(self, child_id: str, cause: Failure) -> None:
        super().__init__(f"child '{child_id}' failed: {cause.message}", cause, child_id=child_id)


class CancelledError(_FailureError):
    code = "Cancelled"


class TimeoutError(_FailureError):
    code = "TimedOut"


class TerminatedError(_FailureError):
    code = "Terminated"


class SettingError(RuntimeError):
    """A missing or wrong setting (an option, an environment variable, a key of a config
    file): the message names it, so a start that could never work stops saying why. Not
    a FuseeError: it is raised before anything runs, never across the wire."""


class Fatal(Exception):
    """An application failure that no retry policy retries."""

    retryable = False
    code: str | None = None

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details


_PLAIN: dict[str, type[FuseeError]] = {
    cls.code: cls
    for cls in (
        NotFoundError,
        AlreadyExistsError,
        UnknownWorkflowError,
        RejectedError,
        StaleVersionError,
        ClosedError,
        BusyError,
        IoError,
        ConnectionError,
        NoHolderError,
    )
}


def failure_from(exc: BaseException, record_stacks: bool = True, _depth: int = 0) -> Failure:
    """Turn an exception into its envelope. Fusee's own errors use their code as type so
    that every SDK reads them back as the same error.

    The envelope is recorded, so nothing in it may fail to encode later, inside the log's
    encoder: a message whose `str()` raises or holds lone surrogates, details that JSON
    cannot hold or that nest without end, and a cause chain that loops are each replaced by
    a description of what they were. Details become plain JSON values here, so a failure
    reads back the same from memory and from disk."""
    if isinstance(exc, _FailureError):
        return Failure(
            message=_text(exc.message),
            type=exc.code,
            cause=exc.cause,
            details=_ids_of(exc),
        )
    if isinstance(exc, FuseeError):
        return Failure(message=_text(exc.message), type=exc.code, retryable=False)
    name = type(exc).__name__
    code = getattr(exc, "code", None)
    retryable = getattr(exc, "retryable", None)
    stack = None
    if record_stacks and exc.__traceback__ is not None:
        try:
            stack = _text("".join(traceback.format_exception(exc))[-STACK_BYTES_MAX:])
        except Exception:  # noqa: BLE001 - a stack that cannot be formatted is left out
            stack = None
    cause = exc.__cause__
    if cause is not None and _depth >= CAUSES_MAX:
        cause = None  # a chain this long loops, or might as well
    try:
        message = str(exc)
    except Exception as error:  # noqa: BLE001 - RecursionError included: any str() failure
        message = f"<the message of a {name} cannot be shown: {type(error).__name__}>"
    return Failure(
        message=_text(message),
        type=None if type(exc) is Exception else _text(name),
        code=_text(code) if isinstance(code, str) else None,
        details=_plain(getattr(exc, "details", None)),
        retryable=retryable if isinstance(retryable, bool) else None,
        stack=stack,
        cause=failure_from(cause, record_stacks, _depth + 1) if cause is not None else None,
    )


CAUSES_MAX = 32
MESSAGE_BYTES_MAX = 64 * 1024


def _text(value: str) -> str:
    """Text the log can encode: lone surrogates replaced, at most 64 KiB."""
    if not value.isascii():
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value if len(value) <= MESSAGE_BYTES_MAX else value[: MESSAGE_BYTES_MAX - 3] + "..."


def _plain(details: Any) -> Any:
    """An error's details as plain JSON values, or a description when JSON cannot hold them."""
    if details is None:
        return None
    from fusee import _codec as codec

    try:
        return codec.decode(codec.encode(details, "the error's details"))
    except CodecError as error:
        return f"<details that cannot be recorded: {error.message}>"


def _ids_of(exc: FuseeError) -> dict[str, Any] | None:
    ids = {k: v for k, v in vars(exc).items() if k in ("step", "child_id")}
    return ids or None


def error_from(failure: Failure) -> FuseeError:
    """The error a caller sees for a recorded failure: a workflow that ended on an
    uncaught StepError raises StepError, so `e.cause.code` is the step's code; Fusee's own
    errors come back as their own classes, whatever process or language recorded them."""
    details = failure.details if isinstance(failure.details, dict) else {}
    cause = failure.cause or failure
    plain = _PLAIN.get(failure.type or "")
    if plain is not None:
        return plain(failure.message)
    if failure.type == "WorkflowFailed":
        return WorkflowError(cause)
    if failure.type == "StepFailed":
        return StepError(str(details.get("step", "?")), cause)
    if failure.type == "ChildFailed":
        return ChildError(str(details.get("child_id", "?")), cause)
    if failure.type == "Cancelled":
        return CancelledError(failure.message, failure.cause)
    if failure.type == "TimedOut":
        return TimeoutError(failure.message, failure.cause)
    if failure.type == "Terminated":
        return TerminatedError(failure.message, failure.cause)
    if failure.type == "Determinism":
        return DeterminismError(failure.message)
    if failure.type == "Codec":
        return CodecError(failure.message)
    return WorkflowError(failure)
