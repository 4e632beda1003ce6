"""The HTTP API's JSON: one msgspec struct per request body, query string and answer.

The handlers (`http_runs.py`) decode requests into these types and encode answers from
them, and `http_openapi.py` builds `GET /v1/openapi.json` from the same types with
`msgspec.json.schema_components`: what the document promises is what the code checks,
field by field. JSON names are camelCase (`idPolicy`, `nextCursor`), as every field name
the docs give for the API. Request types forbid unknown fields: a misspelt option is a
400 naming it, not an option silently ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from fusee._errors import Failure  # a recorded failure, as the journal holds it

# The statuses a listing filters on (fusee/engine/run_handle.py, LISTED): written out so
# the document lists them; `tests/server_mode/test_http_runs.py` checks they agree.
ListedStatus = Literal[
    "running",
    "paused",
    "waiting_for_code",
    "stuck",
    "ok",
    "failed",
    "cancelled",
    "timed_out",
    "terminated",
    "continued",
]
Duration = Annotated[
    int | str,
    msgspec.Meta(
        description="Milliseconds, or a string such as '500ms', '10s', '5m', '2h', '1d'.",
        examples=["30s", 1500],
    ),
]
WAIT_MS_MAX = 300_000  # a long poll's wait at most: under any proxy's idle timeout we know of
LIMIT_MAX = 1000


class Request(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """Base of request bodies and query strings."""


class Answer(msgspec.Struct, rename="camel", omit_defaults=True):
    """Base of answers."""


# -- errors -------------------------------------------------------------------------------


class Error(Answer):
    """Every refusal and failure: the error's `code` (docs/errors.md, the same codes as the
    Python client's errors), a message saying what to do, `docs` (the error's section),
    and for a recorded failure its `cause`."""

    code: str
    message: str
    docs: str
    cause: Failure | None = None


# -- starting and addressing runs ---------------------------------------------------------


class IdPolicy(Request):
    """What a start does when its workflow ID is taken (docs/engine.md)."""

    running: Literal["fail", "use-existing", "terminate-existing"] | None = None
    finished: Literal["allow", "allow-if-failed", "refuse", "use-existing"] | None = None


class StartOptions(Request):
    id_policy: IdPolicy | None = None
    timeout: Duration | None = None
    version: int | None = None
    delay: Duration | None = None
    at: Annotated[
        datetime | int | None,
        msgspec.Meta(description="When the run's code begins: RFC 3339 with a zone, or Unix ms."),
    ] = None


class StartBody(Request):
    """`POST /v1/runs`: start a run of workflow `type` under `id`."""

    type: str
    id: str
    input: Any = None
    options: StartOptions | None = None


class Started(Answer):
    id: str
    shard: int


class SignalBody(Request):
    """A signal's value. `id` makes sending it again harmless (one is drawn when absent);
    with `start`, a run that does not exist is started first (signal-with-start)."""

    value: Any = None
    id: str | None = None
    start: StartBody | None = None


class Signalled(Answer):
    """`signalId`: the ID it was recorded under (absent for a signal with start)."""

    id: str
    signal: str
    signal_id: str | None = None


class UpdateBody(Request):
    """An update's argument. `id` makes sending it again apply it once (one is drawn
    when absent)."""

    arg: Any = None
    id: str | None = None


class Updated(Answer):
    id: str
    update_id: str
    result: Any = None


class QueryString(Request):
    arg: Annotated[str | None, msgspec.Meta(description="The query's argument, as JSON text.")] = None


class Queried(Answer):
    id: str
    result: Any = None


class ReasonBody(Request):
    """Why (kept in the run's record of the request)."""

    reason: str | None = None


class Done(Answer):
    """A request the run took: it is recorded."""

    id: str


class ResetBody(Request):
    """Run the ID again from just before step `beforeStep` (docs/run-operations.md);
    signals received after that point are received again unless `reapplySignals` is
    false."""

    before_step: str
    reapply_signals: bool = True


class Rerun(Answer):
    """The ID's new run: its number."""

    id: str
    run: int


CompletionValue = Annotated[Any, msgspec.Meta(description="The step's value, as JSON (no body: null).")]
CompletionFailure = Annotated[
    Failure | str,
    msgspec.Meta(
        description="The step's failure: a message, or a failure (`message`, `type`, `code`, `details`)."
    ),
]


# -- reading runs -------------------------------------------------------------------------


class RunSummary(Answer):
    """A run as a listing shows it."""

    id: str
    run: int
    type: str
    status: str
    shard: int


class RunView(Answer):
    """A run: its summary, and (unless `journal=false`) its journal, oldest first. Each
    journal entry is a record: its `kind` (`Started`, `StepDone`, `SignalReceived`, ...,
    as fusee/journal.py names them) and its fields in camelCase; payloads as the JSON they
    hold."""

    id: str
    run: int
    type: str
    status: str
    shard: int
    journal: list[dict[str, Any]] | None = None


class DescribeString(Request):
    journal: bool = True


class ResultString(Request):
    wait: Annotated[
        int,
        msgspec.Meta(ge=0, le=WAIT_MS_MAX, description="How long to wait for the end, in ms."),
    ] = 30_000


class StreamString(Request):
    from_: Annotated[int, msgspec.Meta(ge=0, description="The offset to read from.")] = msgspec.field(
        default=0, name="from"
    )
    wait: Annotated[
        int,
        msgspec.Meta(ge=0, le=30_000, description="How long to wait for a chunk, in ms."),
    ] = 30_000


class StreamEnding(Answer):
    status: str
    closed: bool


class StreamBatch(Answer):
    """Durable chunks of a run's stream from `from`; `next` is where to read on; `end` is
    set once the stream is complete and `next` is past its last chunk. `bytes` lists the
    chunks that are bytes, each then base64."""

    run: int
    from_: int = msgspec.field(name="from")
    next: int
    chunks: list[Any]
    bytes: list[int]
    end: StreamEnding | None = None


class RunResult(Answer):
    """`done` false: the run had not ended within `wait` (`status` says where it is);
    ask again. Once done, `status` is how it ended: `result` for `ok`, else `error`."""

    id: str
    done: bool
    status: str
    result: Any = None
    error: Error | None = None


class ListString(Request):
    type: str | None = None
    status: ListedStatus | None = None
    prefix: Annotated[str | None, msgspec.Meta(description="Only workflow IDs that start with it.")] = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=LIMIT_MAX)] = 100
    cursor: Annotated[str | None, msgspec.Meta(description="`nextCursor` of the page before.")] = None
    where: Annotated[
        str | None,
        msgspec.Meta(
            description='A filter as JSON text, on search attributes and the run\'s fields: {"amount": {"gte": 100}}.'
        ),
    ] = None


class RunList(Answer):
    """Runs in workflow ID order; `nextCursor` (absent on the last page) asks for the next."""

    runs: list[RunSummary]
    next_cursor: str | None = None


# -- the server ---------------------------------------------------------------------------


class Info(Answer):
    api: str
    version: str
    shards: int
    access: Annotated[
        str,
        msgspec.Meta(
            description="What the request's token may do: worker, client, read, namespace, or open "
            "(the server has none)."
        ),
    ]
    invoker: bool
    namespace: Annotated[
        str | None,
        msgspec.Meta(description="A namespace token's namespace: it reaches IDs under '<namespace>/'."),
    ] = None


Invocations = Annotated[
    dict[str, Any],
    msgspec.Meta(
        description="The invoker's state, as the `invocations` call answers it (docs/server.md, *Metrics*): "
        "`endpoints` and the shard counts."
    ),
]


class Health(Answer):
    status: Literal["serving", "stopping"]
    shards: int | None = None
