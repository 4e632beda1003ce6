"""What crosses HTTP in invoked mode (docs/invoke.md, *One request*): the body the
server POSTs, and the JSON summary the handler answers with.

The request is decoded strictly on types and leniently on keys: a field of the wrong type,
a missing one or a version this handler does not speak is refused (400), while a key it
does not know is skipped, so a server that adds one keeps working with older handlers.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

VERSION = 1
BODY_BYTES_MAX = 64 << 10  # far above any real request (shards are listed as numbers)

# An invocation ID goes into the worker's OPEN and the server's logs: printable ASCII,
# no spaces, bounded. The server makes them (hex today); anything else is not its.
InvocationId = Annotated[str, msgspec.Meta(pattern=r"^[\x21-\x7e]{1,128}\Z")]
ShardIndex = Annotated[int, msgspec.Meta(ge=0, lt=1 << 16)]
BudgetMs = Annotated[int, msgspec.Meta(gt=0, le=24 * 3600 * 1000)]


class Invocation(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`{"version":1,"invocation":"8f3c…","shards":[2,5],"budgetMs":60000,"reasons":[…]}`"""

    version: int
    invocation: InvocationId
    shards: list[ShardIndex]
    budget_ms: BudgetMs
    reasons: list[str] = []  # why the server invoked (call, message, timer, …): for logs only


class RequestError(ValueError):
    """The body is not an invocation request; the message says what is wrong."""


_decoder = msgspec.json.Decoder(Invocation)


def decode(body: bytes) -> Invocation:
    if len(body) > BODY_BYTES_MAX:
        raise RequestError(f"the body is {len(body)} bytes, over {BODY_BYTES_MAX}: not an invocation")
    try:
        request = _decoder.decode(body)
    except msgspec.DecodeError as error:  # ValidationError included
        raise RequestError(f"not an invocation request: {error}") from None
    if request.version != VERSION:
        raise RequestError(f"version {request.version}: this handler speaks version {VERSION}")
    return request


Exit = Literal["idle", "budget", "lost lease"]


class ShardSummary(msgspec.Struct, kw_only=True, rename="camel"):
    """How one granted shard went."""

    shard: int
    epoch: int
    exit: Exit
    """idle: it was idle and drained; budget: the budget ended first (runs with a step
    still running were handed back); lost lease: it stopped before it could be reported
    (the connection went, or the server refused a write)."""
    runs_advanced: int | None
    """Runs that recorded something here: not counted by the engine yet, so always None
    (null in the answer, whose fields stay as the server reads them)."""
    steps_run: int
    open_ms: float
    work_left: bool = False
    next_due_ms: int | None = None
    handed_back: list[str] = []
    types_without_code: list[str] = []
    error: str | None = None


class Summary(msgspec.Struct, kw_only=True, rename="camel"):
    """The 200 answer."""

    invocation: str
    cold: bool
    """The first invocation this process ran: its start-up (imports, runtime) came on top."""
    shards: list[ShardSummary]
    not_granted: list[int] = []
    """Shards the request named that the server did not grant (another worker took them)."""
    elapsed_ms: float = 0.0


_encoder = msgspec.json.Encoder()
encode = _encoder.encode
