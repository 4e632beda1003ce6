"""The payloads of the protocol's frames: one msgspec struct per frame kind, encoded as
MessagePack arrays (compact, and `bytes` travel as bytes, never as base64).

The frame header says which struct the payload is (`Kind`); `decode(kind, payload)`
checks every field's type and refuses unknown kinds, so a peer can send nothing the
receiving side has not declared. Byte by byte in docs/FORMAT.md, *The wire*.

Who sends what:

    pinger -> server          OPEN, PING (a worker's second connection: see pinger.py)
    worker/client -> server   OPEN, PING, REQUEST, APPEND, PUT_RUN, RELAY, CALL, ANSWER, IDLE,
                              PERMIT_ASK, PERMIT_RETURN, PERMIT_RENEW (workers)
    server -> worker/client   WELCOME, LEASE, REPLY, DURABLE, RUN_PUT, RELAY, CALL, ANSWER,
                              DRAIN, PERMIT_GRANT, PING (a worker's ping, answered)

A connection the server refuses (a bad token, a bad OPEN) gets the token exchange's
REFUSED frame, its reason in UTF-8, and is closed.

Round trips carry a request number (`rid`) chosen by the asking side; everything else is
pipelined and answered in order (DURABLE, RUN_PUT) or not at all (PING, RELAY).
"""

from __future__ import annotations

from typing import Any

import msgspec

from fusee.protocol.frames import FrameError, Kind

VERSION = 1

ROLE_WORKER = "worker"
ROLE_CLIENT = "client"
ROLE_PINGER = "pinger"  # a worker's second connection, written by a thread of its own


class Open(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The first frame after the token exchange (or the first frame, without a token)."""

    version: int
    role: str  # ROLE_WORKER or ROLE_CLIENT
    max_shards: int | None = None  # a worker holds at most this many shards
    invocation: str | None = None  # an invoked worker's invocation ID (docs/invoke.md)
    liveness: bool = True  # the worker pings; the server may revoke a silent lease
    session: bytes = b""  # a pinger: the worker session (from its WELCOME) it keeps alive


class Opened(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What REPLY to a REQUEST `open` of this shard would say (with a first page of up to
    64 KiB), sent ahead in WELCOME: an invoked worker opens its shards at once."""

    shard: int
    epoch: int
    position: int
    runs_len: int
    checkpoint: tuple[int, bytes] | None
    items: list[bytes]


class Welcome(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    shards: int
    granted: list[tuple[int, int]]  # (shard, epoch): what the worker holds from the start
    ping_ms: int
    timeout_ms: int  # 0: the server never revokes a silent lease
    session: bytes = b""  # a worker's: what its pinger connection names
    budget_ms: int = 0  # an invoked worker's: the budget left of its invocation
    opened: list[Opened] = []  # an invoked worker's: granted shards already settled and read
    callback_url: str = ""  # the base of callback URLs (`cb.url`): the server's --public-url


class Lease(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A standby is granted a shard another holder let go."""

    shard: int
    epoch: int


class Ping(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    pass


class Request(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A worker's round trip about one shard it holds: `op` is one of OPS."""

    rid: int
    op: str
    shard: int
    epoch: int
    after: int = 0  # records: after this position; checkpoint: the position it covers
    max_bytes: int = 0  # records: the page size
    offsets: list[int] = []  # runs: the frames to read
    data: bytes = b""  # checkpoint: its bytes


OPS = ("open", "records", "runs", "checkpoint", "release")


class Reply(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    rid: int
    error: str | None = None  # a refusal (stale epoch, a disk error): the shard stops
    position: int = 0  # open: the shard's last durable position
    runs_len: int = 0  # open: the run store's length
    checkpoint: tuple[int, bytes] | None = None  # open: the newest checkpoint
    items: list[bytes] = []  # records, runs: what was read


class Append(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A shard's records from position `first` on, and a request to make them durable."""

    shard: int
    epoch: int
    first: int
    records: list[bytes]


class Durable(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Cumulative durable positions: (shard, epoch, position), one per shard a write covered."""

    positions: list[tuple[int, int, int]]


class PutRun(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A run-store frame at `offset` (computed by the worker; must be the store's length)."""

    shard: int
    epoch: int
    offset: int
    frame: bytes


class RunPut(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The answer to PUT_RUN: where it was written, or why it was refused. A refusal
    refuses every later write to that shard for the rest of the lease."""

    shard: int
    epoch: int
    offset: int
    error: str | None = None


class Relay(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A message or acknowledgment for shard `shard` (fusee.journal.Msg / Ack, encoded)."""

    shard: int
    ack: bool
    item: bytes


class Call(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A client's call, relayed by the server to the holder of `shard` (-1: every holder,
    for a listing). `args` is a MessagePack map of the method's arguments."""

    rid: int
    method: str
    shard: int
    args: bytes


MOVED = "Moved"  # ANSWER's code for a call whose shard the worker no longer holds
# ...for a call left waiting on its run (a result, an update it recorded) when the worker
# let the shard go: the server keeps it for the shard's next holder, and invokes none for
# it (the run's own due time brings one; invoking for the wait would loop).
MOVED_WAITING = "MovedWaiting"


class Answer(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The answer to CALL: a MessagePack value, or an error's code and message (MOVED:
    the server routes the call again; a client never sees it)."""

    rid: int
    value: bytes = b""
    code: str | None = None
    message: str | None = None


class Drain(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """An invoked worker asks the server to route nothing more to these shards; the
    server echoes it once every call it routed there before has gone out (the OK)."""

    shards: list[int]


class Idle(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """How an invoked worker leaves a shard (fusee.engine.idle.IdleReport): counted only
    under the lease epoch it names."""

    shard: int
    epoch: int
    next_due_ms: int | None = None  # relative to now; None: nothing due
    work_left: bool = False
    budget_ended: bool = False
    steps: int = 0
    open_ms: float = 0.0
    types_without_code: list[str] = []
    heartbeats: int = 0  # step heartbeats recorded: progress too, though no step finished


class PermitAsk(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A step waits for a permit of limit `name`: `ticket` is the worker's number for it
    (unique in the worker's process), answered by PERMIT_GRANT when its turn comes.
    `shard`: the step's shard (-1: none said): the server keeps the wait for the shard
    when its holder lets it go (docs/limits.md, *A waiting step holds no invocation*)."""

    ticket: int
    name: str
    priority: int = 0
    key: str | None = None
    weight: int = 1
    shard: int = -1


class PermitGrant(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Permits granted, by ticket, each under a lease of LEASE_MS from now."""

    tickets: list[int]


class PermitReturn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Permits the worker is done with, or tickets it no longer waits on. `unused`:
    permits granted to steps of a shard the worker was letting go of; the server keeps
    them for the shard's next holder instead of granting them again."""

    tickets: list[int]
    unused: bool = False


class PermitRenew(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The permits the worker still holds: their leases run LEASE_MS from now again."""

    tickets: list[int]


# A permit's lease: renewed every RENEW_MS, it lapses LEASE_MS after the last renewal (a
# worker that was SIGKILLed or cut off gives its permits back then, not before).
PERMIT_RENEW_MS = 1_000
# The calls the server answers itself about limits (a CALL naming no shard).
LIMIT_METHODS = frozenset({"limit", "limits", "limit_usage"})
PERMIT_LEASE_MS = 3_000

TYPES: dict[int, type[Any]] = {
    Kind.OPEN: Open,
    Kind.WELCOME: Welcome,
    Kind.LEASE: Lease,
    Kind.PING: Ping,
    Kind.REQUEST: Request,
    Kind.REPLY: Reply,
    Kind.APPEND: Append,
    Kind.DURABLE: Durable,
    Kind.PUT_RUN: PutRun,
    Kind.RUN_PUT: RunPut,
    Kind.RELAY: Relay,
    Kind.CALL: Call,
    Kind.ANSWER: Answer,
    Kind.DRAIN: Drain,
    Kind.IDLE: Idle,
    Kind.PERMIT_ASK: PermitAsk,
    Kind.PERMIT_GRANT: PermitGrant,
    Kind.PERMIT_RETURN: PermitReturn,
    Kind.PERMIT_RENEW: PermitRenew,
}
KIND_OF: dict[type[Any], int] = {cls: kind for kind, cls in TYPES.items()}

_encoder = msgspec.msgpack.Encoder()
_decoders = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in TYPES.items()}
encode_value = _encoder.encode
_any = msgspec.msgpack.Decoder()


def payload(message: Any) -> tuple[int, bytes]:
    """The frame kind and payload bytes of `message`."""
    return KIND_OF[type(message)], _encoder.encode(message)


def decode(kind: int, data: bytes) -> Any:
    """The message a frame carries; FrameError naming the kind when it is not one."""
    decoder = _decoders.get(kind)
    if decoder is None:
        raise FrameError(f"frame kind {kind} is not one this side accepts")
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as error:
        raise FrameError(f"frame kind {kind} ({TYPES[kind].__name__}): {error}") from None


def decode_value(data: bytes) -> Any:
    """A MessagePack value (a call's arguments or answer)."""
    try:
        return _any.decode(data)
    except (msgspec.DecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise FrameError(f"a call's value: {error or 'nested too deeply'}") from None
