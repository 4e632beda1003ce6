"""`fusee.Client`: start, signal, query, update, complete and read runs held by workers
of a `fusee server`, from any process.

The client has the engine's interface (`start`, `run`, `signal_with_start`,
`update_with_start`, `list`, `complete`, `fail`, `close`; a run's `signal`, `query`,
`update`, `result`, `status`, `describe`, `cancel`, `terminate`, `reset`, `retry`,
`resume`), with the same
arguments, the same answers (`list()` an async iterator of `RunSummary`, a status a
`Status`, results typed by the definitions given) and the same errors: a value JSON
cannot hold is a `CodecError` naming its path here, before anything is sent, as the
engine refuses it before anything is recorded. `tests/server_mode/test_api_parity.py` runs one
scenario against both.

A call goes to the server, which relays it to the worker holding the workflow's shard
and brings its answer back; a listing goes to every holder and comes back merged in
shard order. A call for a shard no worker holds fails with `NoHolderError` (retry once a
worker holds it). Errors come back as the engine raised them: the same class, code and
message, and a failed run's recorded failure as its `cause`. The connection is kept up
across server restarts (fusee/client/_link.py).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
import zlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from fusee import _codec as codec
from fusee import _errors as errors
from fusee import _names as names
from fusee import journal as R
from fusee._audit import requester
from fusee._errors import Failure, FuseeError, NoHolderError, failure_from
from fusee._sealing import AesGcm, open_rec, wire_in, wire_out
from fusee.client._link import Link
from fusee.engine.coordinators import Coordinators
from fusee.engine.coordinators.calls import wait_started
from fusee.engine.coordinators.concurrency import cancel_queued, through_queue
from fusee.engine.limits.handle import check_definition
from fusee.engine.objects import ObjectRef, Objects
from fusee.engine.run_handle import RunDescription, RunSummary, listed_status
from fusee.engine.schedules import ScheduleHandle, Schedules
from fusee.engine.stream_reads import ChunkReader
from fusee.engine.where import Where
from fusee.protocol import messages as m
from fusee.protocol.address import Address, parse
from fusee.protocol.connection import ClientConnection
from fusee.protocol.frames import FrameError
from fusee.workflow.definitions import Query, Signal, Update, Workflow, query_of, signal_of, update_of
from fusee.workflow.durations import Duration, at_ms, to_ms

Out = TypeVar("Out")

_failure = msgspec.msgpack.Decoder(Failure)


class _Described(msgspec.Struct):
    """A `describe` answer: RunDescription's fields, its records read as the union of
    record kinds (the engine's own struct names only their base)."""

    summary: RunSummary
    journal: list[R.AnyRecord]


@functools.cache
def _described() -> msgspec.msgpack.Decoder[_Described]:
    return msgspec.msgpack.Decoder(_Described)  # built on first use: it costs ms, off the import


# The calls whose records say who asked: a client sends the requester with them.
AUDITED = frozenset({"signal", "cancel", "terminate", "reset", "retry", "resume"})
SIGNAL_RETRY_S = 60.0  # a signal is sent again under its ID this long (as a call waits at the server)

_BY_CODE: dict[str, type[FuseeError]] = {
    cls.code: cls
    for cls in (
        errors.NotFoundError,
        errors.AlreadyExistsError,
        errors.UnknownWorkflowError,
        errors.RejectedError,
        errors.CodecError,
        errors.DeterminismError,
        errors.ClosedError,
        errors.BusyError,
        errors.IoError,
        errors.ConnectionError,
        errors.LeaseLostError,
        errors.NoHolderError,
    )
}
_FAILURES: dict[str, type[errors._FailureError]] = {
    cls.code: cls
    for cls in (
        errors.StepError,
        errors.WorkflowError,
        errors.ChildError,
        errors.CancelledError,
        errors.TimeoutError,
        errors.TerminatedError,
    )
}


def error_of(answer: m.Answer) -> FuseeError:
    """The error an answer carries, as the engine raised it."""
    code = answer.code or "Fusee"
    message = answer.message or code
    cause = _failure.decode(answer.value) if answer.value else None
    failure_cls = _FAILURES.get(code)
    if failure_cls is not None:
        # Built around the constructors (each takes its own arguments): the same class,
        # message and recorded cause as the engine's.
        failed = failure_cls.__new__(failure_cls)
        FuseeError.__init__(failed, message)
        failed.cause = cause
        return failed
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    error = FuseeError(message)
    error.code = code
    return error


def _payload(value: Any, type_: Any, what: str, sealer: AesGcm | None = None) -> Any:
    """`value` as the engine would record it: encoded as JSON (a `CodecError` naming the
    path of what JSON cannot hold, with the engine's wording), checked against `type_`
    when a definition gives one (the worker sees only the name, and would record a value
    its code cannot read), and sent as the plain values that JSON reads back as, so the
    worker records exactly what the engine would have recorded in process."""
    data = codec.encode(value, what)
    if type_ is not Any:
        codec.decode(data, type_, what)
    return wire_out(sealer, data)  # sealed with a codec: the server sees ciphertext only


def _typed(value: Any, type_: Any, what: str, sealer: AesGcm | None = None) -> Any:
    """An answer as the engine hands it back: opened if sealed (and this client holds
    the key), read into `type_` from its JSON form."""
    value = wire_in(sealer, value)
    if type_ is Any or type_ is None:
        return value
    return codec.decode(codec.encode(value, what), type_, what)


def _type_name(workflow: Workflow[Any] | str) -> str:
    return names.name(workflow if isinstance(workflow, str) else workflow.name, "workflow type name")


def _input(workflow: Workflow[Any] | str, input: Any, sealer: AesGcm | None) -> Any:
    type_ = Any if isinstance(workflow, str) else workflow.input_type
    return _payload(input, type_, "the workflow's input", sealer)


def _ms(timeout: Duration | None) -> int | None:
    return to_ms(timeout, "timeout") if timeout is not None else None


class Client:
    """A connection to a `fusee server` as a client. `await Client.connect(address)`."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.telemetry: Any = None  # fusee.open_telemetry(): starts record the active span
        # fusee.aes_gcm(keys): payloads sealed before they leave, opened when they come back
        self.codec: AesGcm | None = None
        self.address = link.address
        self.schedules = Schedules(self)  # the same handles as an engine's (docs/schedules.md)
        self.coordinators = Coordinators(self)  # debounce and batch (docs/coordinators.md)
        self.object_calls = Objects(self)  # objects' keys (docs/objects.md)

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        token_file: str | None = None,
        tls: dict[str, str] | None = None,
        telemetry: Any = None,
        codec: AesGcm | None = None,
    ) -> Client:
        """`address` as the server's workers write it (`host:port?token-file=...`);
        `token_file` and `tls` ({"ca", "cert", "key", "name"}) add options to it. With
        `telemetry=fusee.open_telemetry()`, a start records the active span's traceparent
        (docs/telemetry.md). With `codec=fusee.aes_gcm(keys)` (the workers' keys), payloads
        leave sealed and answers are opened: the server holds only ciphertext."""
        parsed = parse(address)
        extra: dict[str, Any] = dict(tls or {})
        unknown = set(extra) - {"ca", "cert", "key", "name"}
        if unknown:
            raise errors.RejectedError(f"tls: unknown keys {sorted(unknown)} (ca, cert, key, name)")
        if token_file is not None:
            extra["token_file"] = token_file
        if extra:
            parsed = msgspec.structs.replace(parsed, **extra)
        if telemetry is not None and not hasattr(telemetry, "traceparent"):
            raise errors.RejectedError(f"telemetry={telemetry!r}: expected fusee.open_telemetry() (or None)")
        if codec is not None and not isinstance(codec, AesGcm):
            raise errors.RejectedError(f"codec={codec!r}: expected fusee.aes_gcm(keys) (or None)")
        client = await cls.at(parsed)
        client.telemetry = telemetry
        client.codec = codec
        return client

    @classmethod
    async def at(cls, address: Address) -> Client:
        """A client of the server a worker's `address` names (its worker options, the
        shard cap and the invocation, dropped): how a worker's schedules reach runs on
        shards it does not hold."""
        link = Link(msgspec.structs.replace(address, max_shards=None, invocation=None))
        await link.open()
        return cls(link)

    @property
    def lost(self) -> errors.ConnectionError | None:
        """Why the connection is down, while it is (it is being made again)."""
        return self.link.lost

    @property
    def closed(self) -> bool:
        return self.link.closed

    @property
    def conn(self) -> ClientConnection | None:
        """The connection in use, or the last one while another is being made."""
        return self.link.conn

    @property
    def shards(self) -> int:
        return self.link.shards

    # -- calls ---------------------------------------------------------------------------

    def shard_of(self, id: str) -> int:
        return zlib.crc32(names.name(id, "workflow ID").encode()) % self.link.shards

    async def _answer(self, method: str, shard: int, args: dict[str, Any]) -> bytes:
        try:
            data = m.encode_value(args)
        except TypeError as error:  # an argument that is not a payload (those are JSON already)
            raise errors.RejectedError(f"call {method!r}: {error}") from None
        try:
            answer = await self.link.request(method, shard, data)
        except FrameError as error:  # over the frame limit
            raise errors.RejectedError(f"call {method!r}: {error}") from None
        if answer.code is not None:
            raise error_of(answer)
        return answer.value

    async def call(self, method: str, shard: int | dict[str, Any] = -1, **args: Any) -> Any:
        """Any call the worker serves, by name, with its arguments; its answer as plain values.
        `call(method, {args})` passes the arguments as one map and names no shard: the
        server's own calls take that form (`client.call("invocations", {})`)."""
        if isinstance(shard, dict):
            args, shard = {**shard, **args}, -1
        if type(shard) is not int:
            raise errors.RejectedError(f"call {method!r}: the shard is a number, not {shard!r}")
        if method in AUDITED and "by" not in args:
            by = requester()  # `fusee.as_requester`: the worker records it as `by`
            if by is not None:
                args["by"] = by
        value = await self._answer(method, shard, args)
        return m.decode_value(value) if value else None

    async def start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        version: int | None = None,
        delay: Duration | None = None,
        at: datetime | int | float | None = None,
        traceparent: str | None = None,
    ) -> ClientRun[Out]:
        if delay is not None and at is not None:
            raise errors.RejectedError("start: give delay= or at=, not both")
        if isinstance(wf, Workflow) and wf.concurrency is not None and delay is None and at is None:
            if id_policy is None:  # runs at once: queued on the type's coordinator (docs/coordinators.md)
                queued: ClientRun[Out] = await self.coordinators.enqueue(wf, id, input)
                return queued
        # Sent only when given (a start without them is the call it always was); the
        # worker's clock counts the delay: the run's timer is on it.
        later: dict[str, Any] = (
            {"delay": _ms(delay)} if delay is not None else {"at": at_ms(at, "at")} if at is not None else {}
        )
        if traceparent is None and self.telemetry is not None:
            traceparent = self.telemetry.traceparent()
        if traceparent is not None:  # the worker checks it, and records it in the start
            later["traceparent"] = traceparent
        await self.call(
            "start",
            self.shard_of(id),
            type=_type_name(wf),
            id=id,
            input=_input(wf, input, self.codec),
            id_policy=id_policy,
            timeout=_ms(timeout),
            version=version,
            **later,
        )
        return ClientRun(self, id, wf)

    async def schedule(
        self, name: str, spec: Any, wf: Workflow[Any] | str, input: Any = None
    ) -> ScheduleHandle:
        """Create or update a schedule (docs/schedules.md); its handle."""
        return await self.schedules.create(name, spec, wf, input)

    async def debounce(
        self, wf: Workflow[Any] | str, key: str, input: Any = None, **options: Any
    ) -> ClientRun[Any]:
        """Collapse starts of `wf` with `key` inside `window=` into one run (docs/coordinators.md)."""
        run: ClientRun[Any] = await self.coordinators.debounce(wf, key, input, **options)
        return run

    async def batch(
        self, wf: Workflow[Any] | str, key: str, event: Any = None, **options: Any
    ) -> ClientRun[Any]:
        """Add an event to the key's batch; one run per batch (docs/coordinators.md)."""
        run: ClientRun[Any] = await self.coordinators.batch(wf, key, event, **options)
        return run

    async def limit(
        self, name: str, *, concurrent: int | None = None, per_second: float | None = None
    ) -> None:
        """Define (or change) limit `name`; the server holds it (docs/limits.md)."""
        await self.call("limit", check_definition(name, concurrent, per_second))

    async def limits(self) -> list[dict[str, Any]]:
        """Every limit the server holds, with its usage across every worker."""
        listed: list[dict[str, Any]] = await self.call("limits", {})
        return listed

    async def limit_usage(self, name: str) -> dict[str, int]:
        """`in_use` (permits held) and `waiting` (steps queued) of limit `name`."""
        used: dict[str, int] = await self.call("limit_usage", {"name": names.name(name, "limit name")})
        return used

    def object_ref(self, type: str, key: str) -> ObjectRef:
        """One key of an object type, reached through the server (docs/objects.md)."""
        return self.object_calls.ref(type, key)

    def objects(self, type: str, limit: int | None = None) -> AsyncIterator[str]:
        """The keys of an object type that exist."""
        return self.object_calls.keys(type, limit)

    def run(self, id: str, wf: Workflow[Out] | None = None) -> ClientRun[Out]:
        """A handle; makes no call. `wf` types its result."""
        return ClientRun(self, id, wf)

    async def signal_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        signal: Signal[Any] | str,
        value: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
    ) -> ClientRun[Out]:
        sig = signal_of(signal)
        await self.call(
            "signal_with_start",
            self.shard_of(id),
            type=_type_name(wf),
            id=id,
            input=_input(wf, input, self.codec),
            signal=names.name(sig.name, "signal name"),
            value=_payload(value, sig.type, f"signal '{sig.name}'", self.codec),
            id_policy=id_policy,
            timeout=_ms(timeout),
        )
        return ClientRun(self, id, wf)

    async def update_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        update_id: str | None = None,
        accepted: bool = False,
    ) -> tuple[ClientRun[Out], Any]:
        u = update_of(update)
        extra = {"accepted": True} if accepted else {}
        value = await self.call(
            "update_with_start",
            self.shard_of(id),
            type=_type_name(wf),
            id=id,
            input=_input(wf, input, self.codec),
            update=names.name(u.name, "update name"),
            arg=_payload(arg, u.arg, f"update '{u.name}' argument", self.codec),
            id_policy=id_policy,
            timeout=_ms(timeout),
            # Drawn here, not by the worker: a call moved to the shard's next holder (a
            # handback) or sent again is then the same update, applied once.
            update_id=update_id if update_id is not None else uuid.uuid4().hex,
            **extra,
        )
        return ClientRun(self, id, wf), _typed(value, u.result, f"update '{u.name}' result", self.codec)

    async def complete(self, token: str, value: Any = None) -> None:
        value = _payload(value, Any, "completion value", self.codec)
        await self.call("complete", self.shard_of(_token_id(token)), token=token, value=value)

    async def fail(self, token: str, failure: BaseException | str | Failure) -> None:
        if isinstance(failure, str):
            envelope = Failure(failure)
        elif isinstance(failure, Failure):
            envelope = failure
        else:
            envelope = failure_from(failure)
        await self.call(
            "fail", self.shard_of(_token_id(token)), token=token, failure=msgspec.to_builtins(envelope)
        )

    async def list(
        self,
        type: str | None = None,
        status: str | None = None,
        *,
        where: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RunSummary]:
        """Every run the workers hold, in shard order: an async iterator, as the engine's.
        `where` filters on the run's fields and search attributes, each worker answering
        from its index; with `limit`, the first `limit` by ID."""
        status = listed_status(status)  # refused here too, before the listing is sent
        extra: dict[str, Any] = {}
        if where is not None:
            Where(where)  # a bad filter is refused here, naming what is wrong
            extra["where"] = where
        if limit is not None:
            extra["limit"] = limit  # each shard's first `limit` by ID; merged and cut below
        rows = await self.call("list", -1, type=type, status=status, **extra)
        if limit is not None:
            rows = sorted(rows, key=lambda row: row["id"])[:limit]
        for row in rows:
            yield msgspec.convert(row, RunSummary)

    async def close(self) -> None:
        """Close the connection; a closed client stops connecting again."""
        await self.link.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()


def _token_id(token: str) -> str:
    from fusee.engine.tokens import parse_token

    return parse_token(token)[0]


class ClientRun(Generic[Out]):
    """A run's handle through a client: the engine's `Run` calls, relayed."""

    def __init__(self, client: Client, id: str, wf: Workflow[Out] | str | None = None) -> None:
        self.client = client
        self.id = names.name(id, "workflow ID")
        self.workflow = wf if isinstance(wf, Workflow) else None

    def __repr__(self) -> str:
        return f"<fusee.ClientRun {self.id!r}>"

    @property
    def shard(self) -> int:
        return self.client.shard_of(self.id)  # of the server connected now (its count holds)

    async def result(self) -> Out:
        """Waits for the run's result, however long: a wait the server gives up on (no
        worker took the shard within its limit), whose worker left, or whose connection to
        the server was lost (the client connects again) is asked again."""
        pause = 0.05
        while True:
            try:
                value = await self.client.call("result", self.shard, id=self.id)
                break
            except (NoHolderError, errors.ConnectionError):
                if self.client.closed:
                    raise
            except errors.NotFoundError:
                await through_queue(self)  # a run waiting its turn (docs/coordinators.md)
                continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        type_ = self.workflow.output_type if self.workflow is not None else Any
        result: Out = _typed(value, type_, "the workflow's result", self.client.codec)
        return result

    async def signal(self, signal: Signal[Any] | str, value: Any = None, *, id: str | None = None) -> None:
        """Record a signal, once: it goes under `id` (one is drawn when not given), so the
        retries made here when the answer is lost or the shard moves (a worker's budget
        ended, a server restarted) are recorded at most once (docs/engine.md, *Signal
        IDs*). Gives up after SIGNAL_RETRY_S, raising the last retriable error."""
        sig = signal_of(signal)
        name = names.name(sig.name, "signal name")
        value = _payload(value, sig.type, f"signal '{sig.name}'", self.client.codec)
        signal_id = id if id is not None else uuid.uuid4().hex
        deadline = asyncio.get_running_loop().time() + SIGNAL_RETRY_S
        pause = 0.05
        while True:
            try:
                await self.client.call(
                    "signal", self.shard, id=self.id, name=name, value=value, signal_id=signal_id
                )
                return
            except (NoHolderError, errors.ConnectionError):
                # A closed client says so at once; a lost connection is being made again.
                if self.client.closed or asyncio.get_running_loop().time() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def query(self, query: Query[Any, Any] | str, arg: Any = None) -> Any:
        q = query_of(query)
        name = names.name(q.name, "query name")
        arg = _payload(arg, q.arg, "query argument", self.client.codec)
        value = await self.client.call("query", self.shard, id=self.id, name=name, arg=arg)
        return _typed(value, q.result, f"query '{q.name}' answer", self.client.codec)

    async def update(
        self,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id: str | None = None,
        accepted: bool = False,
    ) -> Any:
        u = update_of(update)
        name = names.name(u.name, "update name")
        arg = _payload(arg, u.arg, f"update '{u.name}' argument", self.client.codec)
        value = await self.client.call(
            "update",
            self.shard,
            id=self.id,
            name=name,
            arg=arg,
            update_id=id if id is not None else uuid.uuid4().hex,  # see update_with_start
            **({"accepted": True} if accepted else {}),
        )
        return _typed(value, u.result, f"update '{u.name}' result", self.client.codec)

    async def status(self) -> RunSummary:
        row = await self.client.call("status", self.shard, id=self.id)
        return msgspec.convert(row, RunSummary)

    async def started(self) -> RunSummary:
        """Wait until the run exists (a debounced or batched run: once its window
        closes); its summary."""
        summary: RunSummary = await wait_started(self)
        return summary

    def stream(self, name: str, *, from_: int = 0) -> ClientStreamReader:
        """A reader of the run's stream through the server, as the engine's: an async
        iterator of durable chunks; `offset` is where to reconnect, `status` how it ended."""
        return ClientStreamReader(self, names.name(name, "stream name"), from_)

    async def describe(self) -> RunDescription:
        """The summary and the journal, as records (as the engine's)."""
        described = _described().decode(await self.client._answer("describe", self.shard, {"id": self.id}))
        sealer = self.client.codec
        if sealer is None:  # a sealed payload stays sealed: shown as {"$encoded": ...}
            return RunDescription(described.summary, list(described.journal))
        return RunDescription(described.summary, [open_rec(sealer, rec) for rec in described.journal])

    async def cancel(self, reason: str | None = None) -> None:
        reason = names.text(reason, "cancel reason")
        try:
            await self.client.call("cancel", self.shard, id=self.id, reason=reason)
        except errors.NotFoundError as error:
            try:  # a run waiting its turn leaves its queue (docs/coordinators.md)
                await cancel_queued(self, reason)
            except errors.NotFoundError:
                raise error from None

    async def terminate(self, reason: str | None = None) -> None:
        reason = names.text(reason, "terminate reason")
        await self.client.call("terminate", self.shard, id=self.id, reason=reason)

    async def reset(self, before_step: str, *, reapply_signals: bool = True) -> int:
        """The ID's next run from just before step `before_step` (as the engine's); its
        run number."""
        step = names.name(before_step, "reset step")
        run_no: int = await self.client.call(
            "reset", self.shard, id=self.id, before_step=step, reapply_signals=reapply_signals
        )
        return run_no

    async def retry(self) -> int:
        """A failed run again from its failed step; the new run's number."""
        run_no: int = await self.client.call("retry", self.shard, id=self.id)
        return run_no

    async def resume(self) -> None:
        """The step paused out of retries runs again with a fresh set of attempts."""
        await self.client.call("resume", self.shard, id=self.id)


class ClientStreamReader(ChunkReader):
    """`client.run(id).stream(name, from_=)`: long polls (`streamRead`) relayed to the
    shard's holder, asked again across handbacks and reconnections, from the offset
    reached: no chunk is missed or handed twice."""

    def __init__(self, run: ClientRun[Any], name: str, from_: int) -> None:
        super().__init__(name, from_)
        self._handle = run

    async def _batch(self) -> tuple[int, list[Any], tuple[str, bool] | None]:
        client, pause = self._handle.client, 0.05
        args: dict[str, Any] = {"id": self._handle.id, "name": self.name, "from": self.offset, "wait": 30_000}
        if self._run is not None:
            args["run"] = self._run
        while True:
            try:
                batch = await client.call("streamRead", self._handle.shard, **args)
                break
            except (NoHolderError, errors.ConnectionError):
                if client.closed:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
        end = batch.get("end")
        chunks = [wire_in(client.codec, chunk) for chunk in batch["chunks"]]
        return batch["run"], chunks, (end["status"], bool(end["closed"])) if end is not None else None
