"""Journal records: what the log, the run store and `describe()` hold.

Records are msgspec Structs encoded as msgpack arrays with an integer tag, so one record
costs a few bytes besides its payloads. Payloads (`bytes` fields) are the JSON or raw
bytes of `fusee._codec`, recorded once and never re-encoded.

Two families, told apart by how replay uses them:
- *issued* records are written when the code calls an operation (a timer's due time, a
  wait, a value drawn by `now`, a message to another workflow). Replay looks them up by
  the operation's position (`seq`) when the code calls it again.
- *event* records are outcomes handed to the code (a step's result, a timer firing, a
  signal). Replay applies them in journal order, running the code until it waits after
  each one, exactly as it ran live.
"""

import enum
from typing import TYPE_CHECKING, Any

import msgspec

from fusee._errors import Failure


class Status(enum.StrEnum):
    """A run's status, and an index entry's. Strings on disk and in answers (a member
    equals its value), so records written before the enum read the same."""

    RUNNING = "running"  # loaded, its code going on
    STUCK = "stuck"  # stopped on a determinism error, until matching code is deployed
    WAITING_FOR_CODE = "waiting_for_code"  # opened by an engine without its type's code
    ACTIVE = "active"  # in a checkpoint: loaded when it was taken (loaded again at recovery)
    PARKED = "parked"  # in the index, out of memory, its next due time kept
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    TERMINATED = "terminated"
    CONTINUED = "continued"  # continued as new: the ID's next run holds it
    # A step ran out of retries under `on_exhausted="pause"`: the run waits for `resume()`.
    # Shown by answers only: in memory the run is RUNNING (it parks, checkpoints and
    # sweeps as one), and `RunState.paused` says which step waits.
    PAUSED = "paused"


ENDED = frozenset({Status.OK, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.TERMINATED})
FINAL = ENDED | {Status.CONTINUED}
STATUS_OF = {status.value: status for status in Status}  # faster than calling Status(value)


class Rec(msgspec.Struct, array_like=True, omit_defaults=True, tag_field="k"):
    """Base of every record."""


class Parent(msgspec.Struct, array_like=True, frozen=True):
    """Where a child's outcome goes: the parent's shard, workflow ID, run and position."""

    shard: int
    wid: str
    run: int
    seq: int
    close: str = "terminate"


# -- the run's life -------------------------------------------------------------------


class Started(Rec, tag=1):
    type: str
    version: int
    input: bytes
    now: int
    seed: int
    deadline: int = 0
    parent: Parent | None = None
    update_id: str | None = None  # update-with-start: the update rides in the start
    update_name: str | None = None
    update_arg: bytes | None = None
    # A delayed start (`start(..., delay=, at=)`): the run exists from its start, and its
    # code begins with a durable sleep until this Unix ms (0: at once).
    not_before: int = 0
    # The W3C traceparent of the span that started the run (docs/telemetry.md): each
    # process that runs the run traces it in that trace. None: the start had none.
    traceparent: str | None = None


class Finished(Rec, tag=2):
    """The run ended. `msg` numbers the outbox message carrying the outcome to a parent;
    `closes` the messages that apply the parent close policy to unfinished children."""

    status: str  # ok, failed, cancelled, timed_out, terminated
    value: bytes | None = None
    failure: Failure | None = None
    msg: int = 0
    closes: list[tuple[str, int, str]] = []
    by: str | None = None  # who asked, for a termination (docs/run-operations.md, *Audit*)


class Reset(Rec, tag=4):
    """A run begun by `reset()` or `retry()`: its records before this one are the previous
    run's (`run`) up to just before step `step`'s first record; the signals after it are
    the ones received after that cut, reapplied (none when `reapply_signals` was false).
    Applying it changes nothing: it marks where the copy ends and who asked."""

    run: int
    step: str
    by: str | None = None
    reapply_signals: bool = True


class ContinuedAsNew(Rec, tag=3):
    """Ends the run and starts the next run of the same ID in one record. `closes` are the
    messages that apply the parent close policy to the run's unfinished children: the run
    that started them has closed, as at any end."""

    input: bytes
    version: int
    seed: int
    now: int
    closes: list[tuple[str, int, str]] = []


# -- steps --------------------------------------------------------------------------


class StepDone(Rec, tag=10):
    seq: int
    name: str
    value: bytes


class Attempt(Rec, tag=11):
    """A failed attempt that will be retried at `retry_at` (unix ms); `failed_at` is when
    it failed (a policy's `max_elapsed` counts from the first failure)."""

    seq: int
    name: str
    attempt: int
    failure: Failure
    retry_at: int
    failed_at: int = 0
    # The retries ran out under `on_exhausted="pause"`: retried only by `resume()` (its
    # `retry_at` is 0, "until resumed").
    paused: bool = False


class StepFailed(Rec, tag=12):
    seq: int
    name: str
    failure: Failure


class Resume(Rec, tag=13):
    """`resume()` of the step paused at `seq`, after its attempt `attempt` (the journal's
    numbering): it runs again with a fresh set of attempts."""

    seq: int
    name: str
    attempt: int
    by: str | None = None


class Heartbeat(Rec, tag=14):
    """The latest progress the attempt of the step at `seq` reported (`s.heartbeat`).
    Coalesced: at most one per step in each flush. It takes no position of its own (it
    names its step's), so heartbeating never shifts a journal; a retry after a crash
    reads the last durable one from `s.progress()`."""

    seq: int
    name: str
    progress: bytes


# -- time, signals, values ------------------------------------------------------------


class TimerStarted(Rec, tag=20):  # issued
    seq: int
    name: str
    due: int


class TimerFired(Rec, tag=21):
    seq: int


class WaitStarted(Rec, tag=22):  # issued
    seq: int
    signal: str
    due: int = 0  # 0: no timeout


class SignalReceived(Rec, tag=23):
    name: str
    value: bytes
    by: str | None = None
    # The sender's ID for it (docs/engine.md, *Signal IDs*): a signal sent again under an
    # ID the run has recorded is not recorded twice.
    id: str | None = None


class Drawn(Rec, tag=24):  # issued: now, random, uuid
    seq: int
    op: str
    value: Any


class CancelRequested(Rec, tag=25):
    reason: str | None = None
    by: str | None = None


class Patched(Rec, tag=26):
    """The run's code took patch `id`'s new branch (`ctx.patched`, docs/engine.md,
    *Patching*). A marker, not an operation: it takes no position, so adding a patch to
    code shifts nothing in the journals of runs that started before it."""

    id: str


class AttributesSet(Rec, tag=27):
    """Search attributes the run's code set (`ctx.set_attributes`): merged over the
    earlier ones, a None value removing its name. A marker with no position, as
    `Patched` is, and never sealed (it holds no payload bytes): listings filter on it
    from the index, without reading the run (docs/engine.md, *Search attributes*)."""

    attrs: dict[str, Any]


class StreamChunk(Rec, tag=28):
    """A chunk appended to stream `stream` (docs/engine.md, *Streams*): by the function
    of the step at `step`, or by the run's code (-1). No position: a stream's offsets are
    its chunks' order in the journal."""

    stream: str
    step: int
    value: bytes


class StreamEnd(Rec, tag=29):
    """Stream `stream` is complete: its writer closed it (`closed`), or the step that
    wrote it, or the run, ended with `status`."""

    stream: str
    status: str
    closed: bool = False


# -- updates ------------------------------------------------------------------------


class UpdateAccepted(Rec, tag=30):
    id: str
    name: str
    arg: bytes


class UpdateDone(Rec, tag=31):
    id: str
    value: bytes | None = None
    failure: Failure | None = None


# -- other workflows ----------------------------------------------------------------


class ChildRequested(Rec, tag=40):  # issued; its message starts the child
    seq: int
    type: str
    id: str
    input: bytes
    msg: int
    close: str = "terminate"
    timeout: int = 0
    trace: str | None = None  # the traceparent the child's start records (docs/telemetry.md)


class ChildStarted(Rec, tag=41):
    """The child's shard answered the start (failure: it refused, e.g. AlreadyExists)."""

    seq: int
    failure: Failure | None = None


class ChildResult(Rec, tag=42):
    seq: int
    value: bytes | None = None
    failure: Failure | None = None


class SignalSent(Rec, tag=43):  # issued
    seq: int
    target: str
    name: str
    value: bytes
    msg: int


class CancelSent(Rec, tag=44):  # issued
    seq: int
    target: str
    reason: str | None
    msg: int


class Delivered(Rec, tag=45):
    """The target of a signal or cancel answered (failure: e.g. NotFound)."""

    seq: int
    failure: Failure | None = None


# -- async completions --------------------------------------------------------------


class CompletionSent(Rec, tag=50):
    """The send function of attempt `attempt` returned; the token is out."""

    seq: int
    name: str
    attempt: int


class Completed(Rec, tag=51):
    seq: int
    value: bytes | None = None
    failure: Failure | None = None


# -- the shard's own bookkeeping (workflow ID "") --------------------------------------


class Acked(Rec, tag=60):
    """The receiver took outbox message `msg` (a child's outcome or a close)."""

    msg: int


class Received(Rec, tag=61):
    """This shard applied message `msg` of shard `src`; a resend gets the same answer."""

    src: int
    msg: int
    failure: Failure | None = None


Record = (
    Started
    | Finished
    | ContinuedAsNew
    | Reset
    | StepDone
    | Attempt
    | StepFailed
    | Resume
    | Heartbeat
    | TimerStarted
    | TimerFired
    | WaitStarted
    | SignalReceived
    | Drawn
    | CancelRequested
    | Patched
    | AttributesSet
    | StreamChunk
    | StreamEnd
    | UpdateAccepted
    | UpdateDone
    | ChildRequested
    | ChildStarted
    | ChildResult
    | SignalSent
    | CancelSent
    | Delivered
    | CompletionSent
    | Completed
    | Acked
    | Received
)

if TYPE_CHECKING:
    AnyRecord = Rec  # what code hands around; msgspec decodes the tagged union below
else:
    AnyRecord = Record

ISSUED = (TimerStarted, WaitStarted, Drawn, ChildRequested, SignalSent, CancelSent)


def op_of(rec: Any) -> tuple[str, str]:
    """The operation (kind, identity) a record stands for: what replay compares with the
    operation the code calls at the same position (`Op.ident`; docs/engine.md, *Runs,
    journals and replay*), and what a determinism error names."""
    if isinstance(rec, (StepDone, Attempt, StepFailed, Resume, Heartbeat)):
        return ("step", rec.name)
    if isinstance(rec, TimerStarted):
        return ("sleep", rec.name)
    if isinstance(rec, WaitStarted):
        return ("wait_for", rec.signal)
    if isinstance(rec, Drawn):
        return (rec.op, rec.op)
    if isinstance(rec, (ChildRequested,)):
        return ("child", f"{rec.type} {rec.id}")
    if isinstance(rec, SignalSent):
        return ("signal_workflow", f"{rec.name} to {rec.target}")
    if isinstance(rec, CancelSent):
        return ("cancel_workflow", rec.target)
    if isinstance(rec, (CompletionSent,)):
        return ("await_completion", rec.name)
    return (type(rec).__name__, str(getattr(rec, "seq", "")))


def payload_fields(cls: type) -> tuple[str, ...]:
    """The fields of a record kind (or `Msg`) that hold payloads (bytes: JSON, or raw),
    read once from its annotations: what a journal shows decoded, and what encryption
    seals (fusee/_sealing.py)."""
    fields = _PAYLOAD_FIELDS.get(cls)
    if fields is None:
        hints = getattr(cls, "__annotations__", {})
        fields = _PAYLOAD_FIELDS[cls] = tuple(n for n, h in hints.items() if "bytes" in str(h))
    return fields


_PAYLOAD_FIELDS: dict[type, tuple[str, ...]] = {}


def attributes_of(records: list[Any]) -> dict[str, Any]:
    """The merged search attributes a journal's `AttributesSet` records leave."""
    attrs: dict[str, Any] = {}
    for rec in records:
        if type(rec) is AttributesSet:
            merge_attributes(attrs, rec.attrs)
    return attrs


def merge_attributes(attrs: dict[str, Any], changes: dict[str, Any]) -> None:
    for name, value in changes.items():
        if value is None:
            attrs.pop(name, None)
        else:
            attrs[name] = value


def pauses(records: list[Any]) -> bool:
    """Whether a journal ends paused. How a listing tells a parked paused run from a parked
    running one without loading it."""
    return bool(paused_attempts(records))


def paused_attempts(records: list[Any]) -> dict[int, Attempt]:
    """The paused attempts a journal ends waiting on, by step position: each a step's
    paused attempt with no record of that step after it (a resume, a result, a cancel's
    failure) and no end. Read from the records, for a run that has no code to replay."""
    paused: dict[int, Attempt] = {}
    for rec in records:
        if isinstance(rec, Attempt) and rec.paused:
            paused[rec.seq] = rec
        elif isinstance(rec, (Resume, StepDone, StepFailed, Completed)):
            paused.pop(rec.seq, None)
        elif isinstance(rec, CancelRequested):
            paused.clear()  # the cancel ends every waiting operation, the paused step too
        elif isinstance(rec, (Finished, ContinuedAsNew)):
            return {}
    return paused


class Entry(msgspec.Struct, array_like=True):
    """One log record: a run's record, or a shard record (`wid` "")."""

    wid: str
    run: int
    rec: AnyRecord


class Frame(msgspec.Struct, array_like=True):
    """A run as the run store keeps it: its whole journal."""

    wid: str
    run: int
    records: list[AnyRecord]


encode_entry = msgspec.msgpack.Encoder().encode
encode_frame = msgspec.msgpack.Encoder().encode


# -- messages between shards, and checkpoints --------------------------------------------


class Msg(msgspec.Struct, array_like=True, omit_defaults=True):
    kind: str  # start, signal, cancel, terminate, result
    src: int  # sending shard
    seq: int  # the sender's message number
    target: str  # the workflow ID it is for
    run: int = 0  # result: the parent's run
    name: str | None = None  # start: workflow type; signal: its name
    value: bytes | None = None
    failure: Failure | None = None
    parent: Parent | None = None
    reason: str | None = None
    timeout: int = 0
    op: int = -1  # the sender's operation waiting for the answer (start, signal, cancel)
    epoch: int = 0  # the sender's lease when it sent this: the answer names it back
    low: int = 0  # the sender's lowest unanswered message then: it never resends one below
    trace: str | None = None  # start: the traceparent the child's start records


class Ack(msgspec.Struct, array_like=True, omit_defaults=True):
    """The receiver's answer: it applied message `seq` of shard `src` (durably)."""

    src: int
    seq: int
    failure: Failure | None = None
    epoch: int = 0  # the lease the message was sent under: another holder's answer is dropped


class IndexEntry(msgspec.Struct, array_like=True):
    """A run the shard does not hold in memory (or, in a checkpoint, any run)."""

    wid: str
    run_no: int
    type: str
    status: str  # active (load at recovery), parked, waiting_for_code, or a final status
    ref: int  # run-store offset of its frame
    due: int = 0  # its next timer (parked runs), unix ms
    key: int = 0  # the hash of `wid` the index keys it by (wid is "" when read from the index)
    # Search attributes (docs/engine.md, *Search attributes*): a run that set some keeps
    # them, its ID and its start time in the index, so a listing filters without reading
    # its frame. None and 0 for the others (and in checkpoints written before them).
    attrs: dict[str, Any] | None = None
    started: int = 0


class Checkpoint(msgspec.Struct, array_like=True):
    position: int
    next_msg: int
    runs: list[IndexEntry]
    outbox: list[tuple[Msg, str, int]]
    received: list[tuple[int, int, Failure | None]]


encode_checkpoint = msgspec.msgpack.Encoder().encode


# Decoders are built on first use, not at import: building their type information costs
# about 2.5 ms, which `import fusee` (on an invoked function's cold start) would pay even
# where nothing is decoded (a client, a process that only starts runs). Once built, each
# is a plain module attribute: no indirection on the decoding path.
_DECODED = {"decode_entry": Entry, "decode_frame": Frame, "decode_checkpoint": Checkpoint}

if TYPE_CHECKING:

    def decode_entry(data: bytes) -> Entry: ...

    def decode_frame(data: bytes) -> Frame: ...

    def decode_checkpoint(data: bytes) -> Checkpoint: ...


def __getattr__(name: str) -> Any:
    type_ = _DECODED.get(name)
    if type_ is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    decode = globals()[name] = msgspec.msgpack.Decoder(type_).decode
    return decode
