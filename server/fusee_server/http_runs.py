"""The HTTP API's `/v1` routes (docs/http-api.md): start, signal, query, update, result,
cancel, terminate, describe and list runs, and the server's info.

Every route is one `Route` in `ROUTES`: its method and path, the msgspec types of its
query string, body and answer, and its handler. The site registers exactly these, and
`http_openapi.py` describes exactly these, so the document cannot name a route the site
lacks, nor a field the handler does not decode.

A handler turns the request into the call a `fusee.Client` would send (the same method
and arguments) and hands it to `Calls`. Through the server that is `RelayCalls`: the
call enters the relay as a client connection's CALL frame does, so it goes to the
shard's holder, waits at the server for an invoked worker, and moves with its shard at a
handback, exactly as a binary client's. An engine serving the API itself would pass an
engine's `Calls` instead (its calls answered by `fusee/engine/remote_calls.py`'s
METHODS), and keep every route.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import dataclasses
import itertools
import re
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from aiohttp import web

import fusee
from fusee import _codec as codec
from fusee import _names as names
from fusee import journal as R
from fusee._errors import DOCS, FuseeError, RejectedError
from fusee._sealing import ENCODED, SEALED
from fusee.engine.tokens import parse_token
from fusee.engine.where import Where
from fusee.journal import FINAL
from fusee.protocol import messages as m
from fusee.workflow.durations import at_ms, to_ms
from fusee_server import access
from fusee_server.access import Grant
from fusee_server.http_guard import Guard, error_response
from fusee_server.http_openapi import document
from fusee_server.http_types import (
    CompletionFailure,
    CompletionValue,
    DescribeString,
    Done,
    Error,
    Info,
    Invocations,
    ListString,
    Queried,
    QueryString,
    ReasonBody,
    Rerun,
    ResetBody,
    ResultString,
    RunList,
    RunResult,
    RunSummary,
    RunView,
    SignalBody,
    Signalled,
    StartBody,
    Started,
    StartOptions,
    StreamBatch,
    StreamEnding,
    StreamString,
    UpdateBody,
    Updated,
)

BODY_BYTES_MAX = codec.PAYLOAD_BYTES_MAX + (1 << 20)  # a payload at its limit, and room for the rest
RETRY_S = 60.0  # a signal is sent again under its ID this long, as fusee.Client does
ENDED_GRACE_S = 5.0  # a run seen ended at a poll's end: its result is on its way

# An error code -> the HTTP status it answers with. A recorded failure (an update's
# handler raised, a run's result) is 422; the codes a retry may cure are 503.
STATUS_OF = {
    "NotFound": 404,
    "AlreadyExists": 409,
    "Determinism": 409,
    "Rejected": 400,
    "StaleVersion": 412,
    "Codec": 400,
    "UnknownWorkflow": 400,
    "Io": 500,
    "Closed": 503,
    "Busy": 503,
    "Connection": 503,
    "LeaseLost": 503,
    "NoHolder": 503,
}
ENDINGS = {  # a result call's failure code -> how the run ended
    "WorkflowFailed": "failed",
    "StepFailed": "failed",
    "ChildFailed": "failed",
    "Cancelled": "cancelled",
    "TimedOut": "timed_out",
    "Terminated": "terminated",
}
RETRIABLE = frozenset({"NoHolder", "Connection"})
# The token of the request being handled: every call a handler makes is checked against
# it (access.check_call), the one check the binary protocol's calls pass too.
_grant: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("grant", default=None)

_failure = msgspec.msgpack.Decoder(fusee.Failure)
_json = msgspec.json.Encoder()


class ApiError(Exception):
    """A refusal or failure, answered as `Error` JSON with `status`."""

    def __init__(self, status: int, code: str, message: str, cause: fusee.Failure | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.cause = cause

    @classmethod
    def of(cls, answer: m.Answer) -> ApiError:
        code = answer.code or "Fusee"
        cause = _failure.decode(answer.value) if answer.value and code in ENDINGS else None
        return cls(STATUS_OF.get(code, 422 if code in ENDINGS else 500), code, answer.message or code, cause)

    def body(self) -> Error:
        return Error(self.code, self.message, DOCS + self.code.lower(), self.cause)


# -- where calls go -------------------------------------------------------------------


class Calls(Protocol):
    """What the routes need: the shard count (a workflow ID's shard) and a call by name,
    answered as the binary protocol answers it."""

    @property
    def shards(self) -> int: ...

    async def call(self, method: str, shard: int, args: dict[str, Any]) -> m.Answer: ...


class Relay(Protocol):
    def call(self, client: Any, call: m.Call) -> None: ...


class RelayCalls:
    """Calls through the server's relay (relay.py), as one more caller beside client
    connections: it numbers its calls and takes their answers back through `send`."""

    def __init__(self, relay: Relay, shards: int) -> None:
        self.relay = relay
        self.shards = shards
        self.closed = False
        self.rids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[m.Answer]] = {}

    async def call(self, method: str, shard: int, args: dict[str, Any]) -> m.Answer:
        if self.closed:
            return m.Answer(0, code="Closed", message="the server is stopping")
        rid = next(self.rids)
        answered: asyncio.Future[m.Answer] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = answered
        try:
            # The relay may answer at once (a refusal, the server's own calls): the
            # future is in place before it can.
            self.relay.call(self, m.Call(rid, method, shard, m.encode_value(args)))
            return await answered
        finally:
            self.waiting.pop(rid, None)

    def send(self, answer: m.Answer) -> None:
        answered = self.waiting.pop(answer.rid, None)
        if answered is not None and not answered.done():
            answered.set_result(answer)

    def close(self) -> None:
        """The server stops: calls still waiting are answered Closed."""
        self.closed = True
        for rid, answered in list(self.waiting.items()):
            if not answered.done():
                answered.set_result(m.Answer(rid, code="Closed", message="the server is stopping; retry"))


# -- the routes -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Asked:
    """A request as a handler sees it: path parameters, the decoded query and body."""

    path: Mapping[str, str]
    query: Any
    body: Any
    grant: Grant | None
    by: str  # who asked, as audited records keep it (Guard.requester)
    if_match: str | None = None  # the version an edit of an object's state was read at


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str  # aiohttp's and OpenAPI's form alike: /v1/runs/{id}
    name: str  # the OpenAPI operationId
    summary: str
    answer: Any
    handler: Callable[[RunsApi, Asked], Awaitable[Any]]
    query: Any = None
    body: Any = None
    status: int = 200
    errors: tuple[int, ...] = (400,)

    @property
    def params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


class RunsApi:
    """The routes' handlers over `calls`; `invoker` says whether the server invokes."""

    def __init__(self, calls: Calls, invoker: Callable[[], bool] = lambda: False) -> None:
        self.calls = calls
        self.invoker = invoker
        self.grant_of: Callable[[web.Request], Grant | None] = lambda _: None  # set by `app`
        self.requester: Callable[[web.Request, Grant | None], str] = lambda _, grant: "http"
        # A result's long poll per run: every poll of one run shares one `result` call,
        # so polling a run that sleeps for days keeps one call waiting, not one per poll.
        self.results: dict[str, asyncio.Task[m.Answer]] = {}

    def shard_of(self, id: str) -> int:
        return zlib.crc32(id.encode()) % self.calls.shards

    async def _send(self, method: str, shard: int, args: dict[str, Any]) -> m.Answer:
        """Every call a route makes, checked first against the request's token."""
        return await self.calls.call(method, shard, _checked(method, args))

    async def _call(self, method: str, id: str, args: dict[str, Any]) -> Any:
        answer = await self._send(method, self.shard_of(id), args)
        if answer.code is not None:
            raise ApiError.of(answer)
        return m.decode_value(answer.value) if answer.value else None

    async def _retried(self, method: str, id: str, args: dict[str, Any]) -> Any:
        """A call that is harmless to send again (it carries its own ID), sent again
        while no worker can answer it, up to RETRY_S, as fusee.Client does."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + RETRY_S, 0.05
        while True:
            try:
                return await self._call(method, id, args)
            except ApiError as error:
                if error.code not in RETRIABLE or loop.time() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    # -- changes ------------------------------------------------------------------------

    async def start(self, asked: Asked) -> Started:
        body: StartBody = asked.body
        id = names.name(body.id, "workflow ID")
        await self._call(
            "start",
            id,
            {"type": names.name(body.type, "workflow type name"), "id": id, "input": body.input}
            | _options(body.options),
        )
        return Started(id, self.shard_of(id))

    async def signal(self, asked: Asked) -> Signalled:
        body: SignalBody = asked.body
        id, name = _id(asked), names.name(asked.path["name"], "signal name")
        if body.start is not None:
            with_start = body.start
            if with_start.id != id:
                raise RejectedError(f"start.id {with_start.id!r} is not the run's ID {id!r} (the path's)")
            args = {"type": names.name(with_start.type, "workflow type name"), "id": id}
            args |= {"input": with_start.input, "signal": name, "value": body.value}
            options = _options(with_start.options)
            if options.keys() - {"id_policy", "timeout"}:
                raise RejectedError("signal with start: only the options idPolicy and timeout apply")
            await self._call("signal_with_start", id, args | options)
            return Signalled(id, name)
        signal_id = names.name(body.id, "signal ID") if body.id is not None else uuid.uuid4().hex
        args = {"id": id, "name": name, "value": body.value, "signal_id": signal_id, "by": _by(asked)}
        await self._retried("signal", id, args)
        return Signalled(id, name, signal_id)

    async def update(self, asked: Asked) -> Updated:
        body: UpdateBody = asked.body
        id, name = _id(asked), names.name(asked.path["name"], "update name")
        update_id = names.name(body.id, "update ID") if body.id is not None else uuid.uuid4().hex
        args = {"id": id, "name": name, "arg": body.arg, "update_id": update_id}
        return Updated(id, update_id, await self._call("update", id, args))

    async def cancel(self, asked: Asked) -> Done:
        id = _id(asked)
        reason = _reason(asked.body, "cancel reason")
        await self._call("cancel", id, {"id": id, "reason": reason, "by": _by(asked)})
        return Done(id)

    async def terminate(self, asked: Asked) -> Done:
        id = _id(asked)
        reason = _reason(asked.body, "terminate reason")
        await self._call("terminate", id, {"id": id, "reason": reason, "by": _by(asked)})
        return Done(id)

    async def reset(self, asked: Asked) -> Rerun:
        body: ResetBody = asked.body
        id, step = _id(asked), names.name(body.before_step, "reset step")
        args = {"id": id, "before_step": step, "reapply_signals": body.reapply_signals, "by": _by(asked)}
        return Rerun(id, await self._call("reset", id, args))

    async def retry(self, asked: Asked) -> Rerun:
        id = _id(asked)
        return Rerun(id, await self._call("retry", id, {"id": id, "by": _by(asked)}))

    async def resume(self, asked: Asked) -> Done:
        id = _id(asked)
        await self._call("resume", id, {"id": id, "by": _by(asked)})
        return Done(id)

    async def complete(self, asked: Asked) -> Done:
        """A completion token's step ends with the body as its value (a callback)."""
        token = asked.path["token"]
        id = parse_token(token)[0]
        await self._call("complete", id, {"token": token, "value": asked.body})
        return Done(id)

    async def fail(self, asked: Asked) -> Done:
        """A completion token's step fails with the body: a message, or a failure."""
        token, failure = asked.path["token"], asked.body
        id = parse_token(token)[0]
        envelope = fusee.Failure(failure) if isinstance(failure, str) else failure
        await self._call("fail", id, {"token": token, "failure": msgspec.to_builtins(envelope)})
        return Done(id)

    # -- reads --------------------------------------------------------------------------

    async def query(self, asked: Asked) -> Queried:
        query: QueryString = asked.query
        id, name = _id(asked), names.name(asked.path["name"], "query name")
        try:
            arg = msgspec.json.decode(query.arg) if query.arg is not None else None
        except msgspec.DecodeError as error:
            raise RejectedError(f"arg: not JSON text ({error})") from None
        return Queried(id, await self._call("query", id, {"id": id, "name": name, "arg": arg}))

    async def describe(self, asked: Asked) -> RunView:
        id = _id(asked)
        if not asked.query.journal:
            return RunView(**_summary(await self._call("status", id, {"id": id})))
        answer = await self._send("describe", self.shard_of(id), {"id": id})
        if answer.code is not None:
            raise ApiError.of(answer)
        described = _described.decode(answer.value)
        return RunView(**_summary(described.summary), journal=[record_json(r) for r in described.journal])

    async def result(self, asked: Asked) -> RunResult:
        """Waits up to `wait` ms for the run's end, on the run's shared `result` call."""
        id = _id(asked)
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + asked.query.wait / 1000, 0.05
        while True:
            waiting = self._result_call(id)
            done, _ = await asyncio.wait([waiting], timeout=max(0.0, deadline - loop.time()))
            if not done:
                break
            answer = waiting.result()
            if answer.code not in RETRIABLE:
                return self._ended(id, answer)
            if loop.time() + pause >= deadline:  # no worker answered it in time: say where it is
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        status = _summary(await self._call("status", id, {"id": id}))["status"]
        if status in FINAL:  # it ended just now: its answer is on its way
            done, _ = await asyncio.wait([self._result_call(id)], timeout=ENDED_GRACE_S)
            if done:
                return self._ended(id, done.pop().result())
        return RunResult(id, False, status)

    async def stream(self, asked: Asked) -> StreamBatch:
        """Durable chunks of the run's stream from `from`, waiting up to `wait` ms for
        one (docs/http-api.md, *Streams*; `Accept: text/event-stream` follows it)."""
        id, name = _id(asked), names.name(asked.path["name"], "stream name")
        query: StreamString = asked.query
        args = {"id": id, "name": name, "from": query.from_, "wait": query.wait}
        return _batch(await self._retried("streamRead", id, args))

    async def stream_events(self, request: web.Request, asked: Asked) -> web.StreamResponse:
        """Server-sent events: one `chunk` event per chunk (its `id` the next offset: a
        reconnecting EventSource sends it back as Last-Event-ID), then an `end` event.
        The first read comes before the response starts, so a refusal is a plain error."""
        id, name = _id(asked), names.name(asked.path["name"], "stream name")
        start = asked.query.from_
        last = request.headers.get("Last-Event-ID", "")
        if last.isdigit():
            start = int(last)
        batch = _batch(
            await self._retried("streamRead", id, {"id": id, "name": name, "from": start, "wait": 0})
        )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        while True:
            for offset, chunk in enumerate(batch.chunks, batch.from_):
                data = _json.encode(chunk).decode()
                await response.write(f"event: chunk\nid: {offset + 1}\ndata: {data}\n\n".encode())
            start = batch.next
            if batch.end is not None:
                end = _json.encode(batch.end).decode()
                await response.write(f"event: end\nid: {start}\ndata: {end}\n\n".encode())
                return response
            args = {"id": id, "name": name, "from": start, "wait": 30_000, "run": batch.run}
            batch = _batch(await self._retried("streamRead", id, args))

    def _result_call(self, id: str) -> asyncio.Task[m.Answer]:
        _checked("result", {"id": id})  # each poll's own token, though polls share the call
        waiting = self.results.get(id)
        if waiting is None:
            waiting = asyncio.ensure_future(self.calls.call("result", self.shard_of(id), {"id": id}))
            self.results[id] = waiting
            waiting.add_done_callback(
                lambda done: self.results.pop(id) if self.results.get(id) is done else None
            )
        return waiting

    @staticmethod
    def _ended(id: str, answer: m.Answer) -> RunResult:
        if answer.code is None:
            return RunResult(id, True, "ok", result=m.decode_value(answer.value) if answer.value else None)
        ending = ENDINGS.get(answer.code)
        if ending is None:
            raise ApiError.of(answer)
        return RunResult(id, True, ending, error=ApiError.of(answer).body())

    async def list_runs(self, asked: Asked) -> RunList:
        query: ListString = asked.query
        after = _cursor(query.cursor) if query.cursor is not None else None
        args = {"type": query.type, "status": query.status, "prefix": query.prefix, "after": after}
        if query.where is not None:
            try:
                where = msgspec.json.decode(query.where)
            except msgspec.DecodeError as error:
                raise RejectedError(f"where: not JSON text ({error})") from None
            Where(where)  # refused here, naming what is wrong, before any worker is asked
            args["where"] = where
        args = _checked("list", args | {"limit": query.limit + 1})  # a namespace's: its prefix
        answer = await self.calls.call("list", -1, args)
        if answer.code is not None:
            raise ApiError.of(answer)
        rows = sorted(
            (
                row
                for row in m.decode_value(answer.value)
                # Again here: a worker of an older version sends every row.
                if row["id"].startswith(args["prefix"] or "") and (after is None or row["id"] > after)
            ),
            key=lambda row: row["id"],
        )
        page = [RunSummary(**_summary(row)) for row in rows[: query.limit]]
        more = len(rows) > query.limit
        return RunList(page, _cursor_of(page[-1].id) if more else None)

    async def info(self, asked: Asked) -> Info:
        grant = asked.grant
        scope = grant.scope.value if grant is not None else "open"
        namespace = grant.namespace if grant is not None else None
        return Info("v1", fusee.__version__, self.calls.shards, scope, self.invoker(), namespace)

    async def invocations(self, asked: Asked) -> dict[str, Any]:
        answer = await self._send("invocations", -1, {})
        if answer.code is not None:
            raise ApiError.of(answer)
        value: dict[str, Any] = m.decode_value(answer.value)
        return value

    # -- serving ------------------------------------------------------------------------

    def add_routes(self, app: web.Application, routes: list[Route]) -> None:
        for route in routes:
            app.router.add_route(route.method, route.path, self._endpoint(route))

    def app(self, guard: Guard, more: Sequence[Route] = ()) -> web.Application:
        """An aiohttp app with the `/v1` routes and `more` (the objects' routes:
        http_objects.py), and the document of them all, behind `guard`."""
        app = web.Application(middlewares=[guard.middleware], client_max_size=BODY_BYTES_MAX)
        self.grant_of = guard.grant_of
        self.requester = guard.requester
        routes = [*ROUTES, *more]
        self.add_routes(app, [*routes, openapi_route(routes)])
        return app

    def _endpoint(self, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def endpoint(request: web.Request) -> web.StreamResponse:
            grant = self.grant_of(request)
            _grant.set(grant)  # this request's task alone: aiohttp runs each in its own
            try:
                asked = Asked(
                    request.match_info,
                    _decoded_query(request, route.query),
                    await _decoded_body(request, route.body),
                    grant,
                    self.requester(request, grant),
                    request.headers.get("If-Match"),
                )
                if route.name == "stream" and "text/event-stream" in request.headers.get("Accept", ""):
                    return await self.stream_events(request, asked)
                answer = await route.handler(self, asked)
            except ApiError as error:
                retry = {"Retry-After": "1"} if error.status == 503 else None
                return error_response(error.status, error.code, error.message, error.cause, retry)
            except FuseeError as error:  # refused here, before anything was sent
                return error_response(STATUS_OF.get(error.code, 400), error.code, error.message)
            return web.Response(
                body=_json.encode(answer), status=route.status, content_type="application/json"
            )

        return endpoint


def _by(asked: Asked) -> str:
    """Who asked, as the records that audit keep it (`by`, docs/run-operations.md,
    *Audit*): the signed-in person, the token's kind, or `http`."""
    return asked.by


def _batch(value: dict[str, Any]) -> StreamBatch:
    chunks = [
        base64.b64encode(chunk).decode() if isinstance(chunk, bytes) else chunk for chunk in value["chunks"]
    ]
    end = value.get("end")
    ending = StreamEnding(end["status"], bool(end["closed"])) if end is not None else None
    return StreamBatch(value["run"], value["from"], value["next"], chunks, value["bytes"], ending)


def _checked(method: str, args: dict[str, Any]) -> dict[str, Any]:
    """`args` as the request's token may send them (access.check_call); 403 if not."""
    try:
        return access.check_call(_grant.get(), method, args)
    except access.Refused as refused:
        raise ApiError(403, "Rejected", str(refused)) from None


def _id(asked: Asked) -> str:
    return names.name(asked.path["id"], "workflow ID")


def _reason(body: ReasonBody | None, what: str) -> str | None:
    return names.text(body.reason if body is not None else None, what)


def _options(options: StartOptions | None) -> dict[str, Any]:
    """A start's options as the `start` call's arguments (only those given)."""
    if options is None:
        return {}
    out: dict[str, Any] = {}
    if options.id_policy is not None:
        out["id_policy"] = {
            k: v for k, v in msgspec.structs.asdict(options.id_policy).items() if v is not None
        }
    if options.timeout is not None:
        out["timeout"] = to_ms(options.timeout, "timeout")
    if options.version is not None:
        out["version"] = options.version
    if options.delay is not None and options.at is not None:
        raise RejectedError("start: give delay or at, not both")
    if options.delay is not None:
        out["delay"] = to_ms(options.delay, "delay")
    if options.at is not None:
        at = options.at
        if not isinstance(at, int) and at.tzinfo is None:
            raise RejectedError(f"at: {at.isoformat()} has no time zone (add Z or an offset)")
        out["at"] = at_ms(at, "at")
    return out


def _summary(row: Any) -> dict[str, Any]:
    return {key: row[key] for key in ("id", "run", "type", "status", "shard")}


def _cursor_of(id: str) -> str:
    return base64.urlsafe_b64encode(id.encode()).decode().rstrip("=")


def _cursor(cursor: str) -> str:
    try:
        return base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        raise RejectedError(f"cursor {cursor[:40]!r}: not one a listing gave (nextCursor)") from None


class _Described(msgspec.Struct):
    """A `describe` answer: the summary and the records, as the union of record kinds."""

    summary: dict[str, Any]
    journal: list[R.AnyRecord]


_described = msgspec.msgpack.Decoder(_Described)


def record_json(record: Any) -> dict[str, Any]:
    """A journal record as JSON: its kind, then its fields in camelCase; a payload as the
    JSON it holds (raw bytes as `{"base64": ...}`)."""
    out: dict[str, Any] = {"kind": type(record).__name__}
    for field in record.__struct_fields__:
        out[_camel(field)] = _plain(getattr(record, field))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        if value[:1] == codec.RAW:
            return {"base64": base64.b64encode(value[1:]).decode()}
        if value[:1] == SEALED:  # encrypted by the worker's codec: the server has no key
            return {ENCODED: base64.b64encode(value).decode()}
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:  # an encrypted payload, say: shown as its bytes
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, msgspec.Struct):
        return {_camel(k): _plain(v) for k, v in msgspec.structs.asdict(value).items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _decoded_query(request: web.Request, type_: Any) -> Any:
    if type_ is None:
        return None
    try:
        return msgspec.convert(dict(request.query), type_, strict=False)
    except msgspec.ValidationError as error:
        raise RejectedError(f"the query string: {error}") from None


async def _decoded_body(request: web.Request, type_: Any) -> Any:
    if type_ is None:
        return None
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, "Rejected", f"the body is over {BODY_BYTES_MAX:,} bytes") from None
    try:
        # No body: the defaults of a body's fields, or null for a body that is a value.
        struct = isinstance(type_, type) and issubclass(type_, msgspec.Struct)
        return msgspec.json.decode(data or (b"{}" if struct else b"null"), type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise RejectedError(f"the body: {error}") from None


def _r(method: str, path: str, name: str, summary: str, answer: Any, handler: Any, **more: Any) -> Route:
    return Route(method, path, name, summary, answer, handler, **more)


ROUTES = [
    _r("POST", "/v1/runs", "start", "Start a run", Started, RunsApi.start, body=StartBody, status=201,
       errors=(400, 409)),
    _r("GET", "/v1/runs", "list", "List runs, a page at a time", RunList, RunsApi.list_runs, query=ListString),
    _r("GET", "/v1/runs/{id}", "describe", "A run's summary and journal", RunView, RunsApi.describe,
       query=DescribeString, errors=(400, 404)),
    _r("GET", "/v1/runs/{id}/result", "result", "Wait for a run's result (long poll)", RunResult,
       RunsApi.result, query=ResultString, errors=(400, 404)),
    _r("GET", "/v1/runs/{id}/streams/{name}", "stream", "Read a run's stream: durable chunks (long poll)",
       StreamBatch, RunsApi.stream, query=StreamString, errors=(400, 404)),
    _r("POST", "/v1/runs/{id}/signals/{name}", "signal", "Send a signal", Signalled, RunsApi.signal,
       body=SignalBody, errors=(400, 404)),
    _r("GET", "/v1/runs/{id}/queries/{name}", "query", "Ask a query", Queried, RunsApi.query,
       query=QueryString, errors=(400, 404, 422)),
    _r("POST", "/v1/runs/{id}/updates/{name}", "update", "Send an update and wait for its result", Updated,
       RunsApi.update, body=UpdateBody, errors=(400, 404, 422)),
    _r("POST", "/v1/runs/{id}/cancel", "cancel", "Cancel a run", Done, RunsApi.cancel, body=ReasonBody,
       errors=(400, 404)),
    _r("POST", "/v1/runs/{id}/terminate", "terminate", "Terminate a run", Done, RunsApi.terminate,
       body=ReasonBody, errors=(400, 404)),
    _r("POST", "/v1/runs/{id}/reset", "reset", "Run the ID again from before a step", Rerun, RunsApi.reset,
       body=ResetBody, errors=(400, 404)),
    _r("POST", "/v1/runs/{id}/retry", "retry", "Run a failed run again from its failed step", Rerun,
       RunsApi.retry, errors=(400, 404)),
    _r("POST", "/v1/runs/{id}/resume", "resume", "Resume the step paused out of retries", Done, RunsApi.resume,
       errors=(400, 404)),
    _r("POST", "/v1/complete/{token}", "complete", "Complete a step waiting on a callback: the body is its value",
       Done, RunsApi.complete, body=CompletionValue, errors=(400, 404)),
    _r("POST", "/v1/fail/{token}", "fail", "Fail a step waiting on a callback", Done, RunsApi.fail,
       body=CompletionFailure, errors=(400, 404)),
    _r("GET", "/v1/info", "info", "The server, and what this request's token may do", Info, RunsApi.info),
    _r("GET", "/v1/invocations", "invocations", "The invoker's endpoints and counts", Invocations,
       RunsApi.invocations),
]  # fmt: skip


def openapi_route(routes: list[Route]) -> Route:
    """`GET /v1/openapi.json`, itself one of the routes the document describes."""

    async def served(api: RunsApi, asked: Asked) -> dict[str, Any]:
        return described

    route = Route("GET", "/v1/openapi.json", "openapi", "This document", dict[str, Any], served)
    described = document([*routes, route])
    return route
