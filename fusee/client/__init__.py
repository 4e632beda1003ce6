"""`fusee.Client`: start, signal, query, update, complete and read runs held by workers
of a `fusee server`, from any process.

A call goes to the server, which relays it to the worker holding the workflow's shard
and brings its answer back; a listing goes to every holder and comes back merged in
shard order. A call for a shard no worker holds fails at once with `NoHolderError`
(retry once a worker holds it). Errors come back as the engine raised them: the same
class, code and message, and a failed run's recorded failure as its `cause`.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import msgspec

from fusee import _codec as codec
from fusee import _errors as errors
from fusee._errors import ConnectionError, Failure, FuseeError, NoHolderError
from fusee.engine.handle import RunSummary
from fusee.protocol import messages as m
from fusee.protocol.address import Address, parse
from fusee.protocol.connection import ClientConnection, connect
from fusee.protocol.frames import FrameError
from fusee.workflow.definitions import Query, Signal, Update

_failure = msgspec.msgpack.Decoder(Failure)

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


def _name(thing: Any) -> str:
    return thing if isinstance(thing, str) else str(thing.name)


def _checked(definition: Any, value: Any, type_field: str, what: str) -> Any:
    """`value`, refused (CodecError) here when a typed definition (a Signal, an Update, a
    Query) says it is not of its type, as the engine refuses it in process: the worker
    only sees the name, and would record a value its code cannot read."""
    if isinstance(definition, (Signal, Update, Query)):
        codec.convert(value, getattr(definition, type_field), f"{what} '{definition.name}'")
    return value


class Client:
    """A connection to a `fusee server` as a client. `await Client.connect(address)`."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.conn: ClientConnection | None = None
        self.shards = 0
        self.rids = 0
        self.pending: dict[int, asyncio.Future[m.Answer]] = {}
        self.lost: ConnectionError | None = None

    @classmethod
    async def connect(
        cls, address: str, *, token_file: str | None = None, tls: dict[str, str] | None = None
    ) -> Client:
        """`address` as the server's workers write it (`host:port?token-file=...`);
        `token_file` and `tls` ({"ca", "cert", "key", "name"}) add options to it."""
        parsed = parse(address)
        extra: dict[str, Any] = dict(tls or {})
        unknown = set(extra) - {"ca", "cert", "key", "name"}
        if unknown:
            raise errors.RejectedError(f"tls: unknown keys {sorted(unknown)} (ca, cert, key, name)")
        if token_file is not None:
            extra["token_file"] = token_file
        if extra:
            parsed = msgspec.structs.replace(parsed, **extra)
        client = cls(parsed)
        client.conn, welcome = await connect(parsed, m.Open(m.VERSION, m.ROLE_CLIENT, liveness=False), client)
        client.shards = welcome.shards
        return client

    # -- the connection's handler --------------------------------------------------------

    def on_message(self, message: Any) -> None:
        if type(message) is m.Answer:
            future = self.pending.pop(message.rid, None)
            if future is not None and not future.done():
                future.set_result(message)

    def on_lost(self, error: ConnectionError) -> None:
        self.lost = error
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()

    # -- calls ---------------------------------------------------------------------------

    def shard_of(self, id: str) -> int:
        return zlib.crc32(id.encode()) % self.shards

    async def call(self, method: str, shard: int, **args: Any) -> Any:
        if self.lost is not None:
            raise self.lost
        assert self.conn is not None
        self.rids += 1
        future: asyncio.Future[m.Answer] = asyncio.get_running_loop().create_future()
        try:
            self.conn.send(m.Call(self.rids, method, shard, m.encode_value(args)))
        except (FrameError, TypeError) as error:  # over the frame limit, or not encodable
            raise errors.RejectedError(f"call {method!r}: {error}") from None
        self.pending[self.rids] = future
        answer = await future
        if answer.code is not None:
            raise error_of(answer)
        return m.decode_value(answer.value) if answer.value else None

    async def start(
        self,
        workflow: Any,
        id: str,
        input: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: str | int | None = None,
    ) -> ClientRun:
        await self.call(
            "start",
            self.shard_of(id),
            type=_name(workflow),
            id=id,
            input=input,
            id_policy=id_policy,
            timeout=timeout,
        )
        return ClientRun(self, id)

    async def signal_with_start(
        self, workflow: Any, id: str, input: Any, signal: Any, value: Any = None
    ) -> ClientRun:
        await self.call(
            "signal_with_start",
            self.shard_of(id),
            type=_name(workflow),
            id=id,
            input=input,
            signal=_name(signal),
            value=_checked(signal, value, "type", "signal"),
        )
        return ClientRun(self, id)

    async def update_with_start(
        self,
        workflow: Any,
        id: str,
        input: Any,
        update: Any,
        arg: Any = None,
        *,
        update_id: str | None = None,
    ) -> tuple[ClientRun, Any]:
        value = await self.call(
            "update_with_start",
            self.shard_of(id),
            type=_name(workflow),
            id=id,
            input=input,
            update=_name(update),
            arg=_checked(update, arg, "arg", "update"),
            update_id=update_id,
        )
        return ClientRun(self, id), value

    def run(self, id: str) -> ClientRun:
        """A handle; makes no call."""
        return ClientRun(self, id)

    async def complete(self, token: str, value: Any = None) -> None:
        await self.call("complete", self.shard_of(_token_id(token)), token=token, value=value)

    async def fail(self, token: str, message: str) -> None:
        await self.call("fail", self.shard_of(_token_id(token)), token=token, message=message)

    async def list(self, type: str | None = None, status: str | None = None) -> list[RunSummary]:
        rows = await self.call("list", -1, type=type, status=status)
        return [msgspec.convert(row, RunSummary) for row in rows]

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()


def _token_id(token: str) -> str:
    from fusee.engine.engine import parse_token

    return parse_token(token)[0]


class ClientRun:
    """A run's handle through a client: the engine's `Run` calls, relayed."""

    def __init__(self, client: Client, id: str) -> None:
        self.client = client
        self.id = id
        self.shard = client.shard_of(id)

    def __repr__(self) -> str:
        return f"ClientRun({self.id!r})"

    async def result(self) -> Any:
        """Waits for the run's result, however long: a wait the server gives up on (no
        worker took the shard within its limit) or whose worker left is asked again."""
        pause = 0.05
        while True:
            try:
                return await self.client.call("result", self.shard, id=self.id)
            except (NoHolderError, ConnectionError):
                if self.client.lost is not None:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def signal(self, signal: Any, value: Any = None) -> None:
        value = _checked(signal, value, "type", "signal")
        await self.client.call("signal", self.shard, id=self.id, name=_name(signal), value=value)

    async def query(self, query: Any, arg: Any = None) -> Any:
        arg = _checked(query, arg, "arg", "query")
        return await self.client.call("query", self.shard, id=self.id, name=_name(query), arg=arg)

    async def update(self, update: Any, arg: Any = None, *, id: str | None = None) -> Any:
        arg = _checked(update, arg, "arg", "update")
        return await self.client.call(
            "update", self.shard, id=self.id, name=_name(update), arg=arg, update_id=id
        )

    async def cancel(self, reason: str | None = None) -> None:
        await self.client.call("cancel", self.shard, id=self.id, reason=reason)

    async def terminate(self, reason: str | None = None) -> None:
        await self.client.call("terminate", self.shard, id=self.id, reason=reason)

    async def describe(self) -> RunSummary:
        row = await self.client.call("describe", self.shard, id=self.id)
        return msgspec.convert(row, RunSummary)
