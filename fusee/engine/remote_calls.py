"""A worker engine in server mode: it takes the shards a standby is granted while it
runs, and answers the calls the server relays to it from clients.

A call names its method and carries its arguments as a MessagePack map; the answer is
the method's value, or the error's code and message (and a recorded failure's envelope),
so a client raises the same error the engine would have raised in process.

A shard let go of cleanly (a budget's end, a drain, a clean close) first answers what it
accepted: a call failed back to its caller after its record was written would be applied
twice when the caller retries as told. Calls that only wait (a result, an update's
answer) are answered MOVED instead, and the server routes them to the shard's next
holder; so is any call that arrives once the shard is leaving, and one whose record was
never sent when the shard went (it is not in the log). One whose record was sent is
answered, even when the close missed its deadline before the record was known durable:
the server then holds the answer until the record is (Durability.settle_sent). A remote
caller never sees the engine's own ClosedError (docs/server.md, *Calls at a handback*).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import msgspec

from fusee import _codec as codec
from fusee import _errors as errors
from fusee._audit import as_requester
from fusee._errors import (
    ClosedError,
    Failure,
    FuseeError,
    LeaseLostError,
    RejectedError,
    _FailureError,
)
from fusee._sealing import AesGcm, seal_rec, wire_in, wire_out
from fusee.engine.durability import RELAYED
from fusee.engine.run_handle import Run, RunDescription, RunSummary, list_runs
from fusee.engine.shard import Shard
from fusee.protocol import messages as m
from fusee.protocol.frames import FrameError
from fusee.storage.remote import RemoteStorage

logger = logging.getLogger("fusee.worker")

_LEAVING = "the shard is being let go of"  # a waiting call's cancellation, answered MOVED

_encode = msgspec.msgpack.encode


class ServedEngine(Protocol):
    """What answering calls needs of the worker's engine (`fusee/engine/engine.py`): its
    public calls, the shards it holds, attaching one, and the hook it runs before it lets
    one go."""

    before_leave: Callable[[int, float | None], Awaitable[None]] | None
    codec: AesGcm | None

    @property
    def closed(self) -> bool: ...
    @property
    def by_index(self) -> Mapping[int, Shard]: ...
    async def attach(self, index: int) -> None: ...
    def run(self, id: str) -> Run[Any]: ...
    async def start(
        self,
        wf: str,
        id: str,
        input: Any = ...,
        *,
        id_policy: Any = ...,
        timeout: Any = ...,
        version: Any = ...,
        delay: Any = ...,
        at: Any = ...,
        traceparent: Any = ...,
    ) -> object: ...
    async def signal_with_start(
        self,
        wf: str,
        id: str,
        input: Any,
        signal: str,
        value: Any = ...,
        *,
        id_policy: Any = ...,
        timeout: Any = ...,
    ) -> object: ...
    async def update_with_start(
        self,
        wf: str,
        id: str,
        input: Any,
        update: str,
        arg: Any = ...,
        *,
        id_policy: Any = ...,
        timeout: Any = ...,
        update_id: Any = ...,
        accepted: bool = ...,
    ) -> tuple[object, Any]: ...
    async def complete(self, token: str, value: Any = ...) -> None: ...
    async def fail(self, token: str, failure: BaseException | str | Failure) -> None: ...
    def list(self, type: Any = ..., status: Any = ..., *, where: Any = ...) -> AsyncIterator[RunSummary]: ...


class CallServer:
    def __init__(self, engine: ServedEngine, storage: RemoteStorage) -> None:
        self.engine = engine
        self.storage = storage
        self.attaching: dict[int, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        # Calls being answered, by shard: a shard let go of waits for them (see above).
        self.accepted: dict[int, set[asyncio.Task[Any]]] = {}
        # Shards being let go of; and per shard, the calls that only wait on it (a result,
        # an update's answer), cancelled when it goes: the next holder answers them.
        self.leaving: set[int] = set()
        self.waits: dict[int, set[asyncio.Task[Any]]] = {}
        engine.before_leave = self.before_leave
        storage.on_lease = self.leased
        storage.serve_calls(self.called)
        for index in sorted(storage.granted):
            if index not in engine.by_index:
                self.leased(index)  # granted while the engine was opening

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def leased(self, index: int) -> None:
        if index in self.attaching or self.engine.closed:
            return
        self.leaving.discard(index)  # held again: a new lease
        self.attaching[index] = self._spawn(self._attach(index))

    async def _attach(self, index: int) -> None:
        epoch = self.storage.granted.get(index)
        try:
            await self.engine.attach(index)
            logger.info("shard %d: taken over (epoch %d)", index, epoch or 0)
        except FuseeError as error:
            logger.warning("shard %d: could not take it over: %s", index, error)
            # Let the lease go, or the shard would stay with a holder that runs nothing;
            # only this grant: the storage may have connected again and been granted the
            # shard anew meanwhile (docs/server.md, *Reconnecting*).
            if epoch is not None:
                self.storage.release(index, epoch)
        finally:
            self.attaching.pop(index, None)
            if self.storage.granted.get(index) not in (None, epoch) and index not in self.engine.by_index:
                self.leased(index)  # granted again while this attach was failing

    def called(self, call: m.Call) -> None:
        task = self._spawn(self._answer(call))
        if call.shard >= 0:
            calls = (self.waits if call.method in WAITS else self.accepted).setdefault(call.shard, set())
            calls.add(task)
            task.add_done_callback(calls.discard)

    async def before_leave(self, index: int, timeout: float | None) -> None:
        """Shard `index` is about to be let go of: calls that only wait are answered
        MOVED, new ones too, and the others accepted before now are answered (within
        `timeout` seconds: a call still unanswered then goes as at a crash)."""
        self.leaving.add(index)
        for task in self.waits.pop(index, ()):
            task.cancel(_LEAVING)  # answered MOVED by `_answer`, which holds no task of its own
        pending = [task for task in self.accepted.get(index, ()) if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def _moved(self, call: m.Call, waiting: bool = False) -> m.Answer:
        return m.Answer(
            call.rid, code=m.MOVED_WAITING if waiting else m.MOVED, message=f"shard {call.shard} let go"
        )

    def _waiting_on_run(self, call: m.Call, args: dict[str, Any]) -> bool:
        """A waiting call's progress depends only on its run now (a result; an update
        whose acceptance is recorded): its shard need not be invoked for it."""
        if call.method == "result":
            return True
        shard = self.engine.by_index.get(call.shard)
        state = shard.runs.get(args.get("id")) if shard is not None else None  # type: ignore[arg-type]
        return state is not None and args.get("update_id") in state.updates_accepted

    async def _answer(self, call: m.Call) -> None:
        RELAYED.set(True)  # this task's own context: what it waits durable for, the server settles
        args: Any = None
        try:
            attaching = self.attaching.get(call.shard)
            if attaching is not None:
                await asyncio.wait([attaching])  # the server routed it here: the lease is ours
            if call.shard >= 0 and (
                self.engine.closed or call.shard not in self.engine.by_index or call.shard in self.leaving
            ):
                # Let go (or being let go: the engine closing) before the server heard: it
                # routes the call again, to the next holder, instead of the caller getting
                # a refusal.
                self.storage.send(self._moved(call))
                return
            if self.engine.closed:  # a listing: asked again, it goes to the shards' next holders
                raise errors.ConnectionError("the worker is closing; retry")
            method = METHODS.get(call.method)
            if method is None:
                raise RejectedError(f"no call {call.method!r} (expected one of {', '.join(sorted(METHODS))})")
            args = m.decode_value(call.args)
            if not isinstance(args, dict):
                raise RejectedError("a call's arguments are a map")
            if call.method == "list" and call.shard >= 0:
                # One shard's part of a listing (the server sends a part per shard and
                # merges them): that shard's rows only, so a part routed on to the shard's
                # next holder is not answered twice for another.
                value = await _list_shard(self.engine, call.shard, args)
            else:
                # The requester the client named (`fusee.as_requester`), recorded as `by`
                # by the calls that audit (docs/run-operations.md, *Audit*).
                by = args.get("by")
                with as_requester(by if isinstance(by, str) else None):
                    value = await call_sealed(self.engine, call.method, method, args)
            answer = m.Answer(call.rid, _encode(value))
        except asyncio.CancelledError as cancelled:
            task = asyncio.current_task()
            if cancelled.args != (_LEAVING,) or task is None:
                raise
            # A call that only waits, its shard being let go of: the next holder answers it.
            task.uncancel()
            waiting = isinstance(args, dict) and self._waiting_on_run(call, args)
            answer = self._moved(call, waiting)
        except (ClosedError, LeaseLostError) as error:
            # The shard went (closed, drained, its lease lost) while the call was being
            # answered: the caller hears MOVED (the server routes it to the next holder),
            # or, for a listing, that it may retry; never the engine's ClosedError.
            if call.shard >= 0:
                answer = self._moved(call)
            else:
                answer = m.Answer(call.rid, b"", errors.ConnectionError.code, f"{error}; retry")
        except (FuseeError, *MALFORMED) as error:
            answer = error_answer(call, error)
        try:
            self.storage.send(answer)
        except FrameError as error:  # a value over the frame limit
            self.storage.send(m.Answer(call.rid, b"", RejectedError.code, f"call {call.method!r}: {error}"))


# What a call's arguments of the wrong shape raise in a method (a missing key, a wrong type).
MALFORMED = (TypeError, ValueError, KeyError, msgspec.ValidationError)


def error_answer(call: m.Call, error: Exception) -> m.Answer:
    """The answer for a call that raised `error` (a FuseeError, or MALFORMED arguments):
    its code and message, and a recorded failure's envelope, so the caller raises the
    same error the engine raised."""
    if isinstance(error, _FailureError):
        cause = _encode(error.cause) if error.cause is not None else b""
        return m.Answer(call.rid, cause, error.code, error.message)
    if isinstance(error, FuseeError):
        return m.Answer(call.rid, b"", error.code, error.message)
    return m.Answer(call.rid, b"", RejectedError.code, f"call {call.method!r}: {error!r}")


async def answer_here(engine: ServedEngine, call: m.Call) -> m.Answer:
    """A call answered by `engine` in this process, as a worker answers it for the server
    (the HTTP API of an engine that serves it itself: fusee_server/http_engine.py)."""
    method = METHODS.get(call.method)
    try:
        if method is None:
            raise RejectedError(f"no call {call.method!r} (expected one of {', '.join(sorted(METHODS))})")
        args = m.decode_value(call.args)
        if not isinstance(args, dict):
            raise RejectedError("a call's arguments are a map")
        by = args.get("by")  # who asked, recorded by the calls that audit (as in CallServer)
        with as_requester(by if isinstance(by, str) else None):
            return m.Answer(call.rid, _encode(await call_sealed(engine, call.method, method, args)))
    except (FuseeError, *MALFORMED) as error:
        return error_answer(call, error)


# Payload encryption (fusee/_sealing.py): the arguments that carry payloads, and the calls
# whose answers do. A worker with a codec opens what a client sealed, and seals what it
# answers: the server in between holds only ciphertext.
PAYLOAD_ARGS = ("input", "value", "arg")
PAYLOAD_ANSWERS = frozenset({"result", "query", "update", "update_with_start"})


async def call_sealed(
    engine: ServedEngine,
    name: str,
    method: Callable[[ServedEngine, dict[str, Any]], Awaitable[Any]],
    args: dict[str, Any],
) -> Any:
    sealer = engine.codec
    if sealer is None:
        return await method(engine, args)
    for key in PAYLOAD_ARGS:
        if key in args:
            args[key] = wire_in(sealer, args[key])
    value = await method(engine, args)
    if name in PAYLOAD_ANSWERS:
        return wire_out(sealer, codec.encode(value, f"the {name} answer"))
    if name == "describe":
        return RunDescription(value.summary, [seal_rec(sealer, rec) for rec in value.journal])
    return value


def _summary(row: Any) -> dict[str, Any]:
    return {"id": row.id, "run": row.run, "type": row.type, "status": row.status, "shard": row.shard}


async def _start(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.start(
        a["type"],
        a["id"],
        a.get("input"),
        id_policy=a.get("id_policy"),
        timeout=a.get("timeout"),
        version=a.get("version"),
        delay=a.get("delay"),
        at=a.get("at"),
        traceparent=a.get("traceparent"),
    )
    return {"id": a["id"]}


async def _signal_with_start(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.signal_with_start(
        a["type"],
        a["id"],
        a.get("input"),
        a["signal"],
        a.get("value"),
        id_policy=a.get("id_policy"),
        timeout=a.get("timeout"),
    )
    return {"id": a["id"]}


async def _update_with_start(engine: ServedEngine, a: dict[str, Any]) -> Any:
    _, value = await engine.update_with_start(
        a["type"],
        a["id"],
        a.get("input"),
        a["update"],
        a.get("arg"),
        id_policy=a.get("id_policy"),
        timeout=a.get("timeout"),
        update_id=a.get("update_id"),
        accepted=a.get("accepted") is True,
    )
    return value


async def _signal(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).signal(a["name"], a.get("value"), id=a.get("signal_id"))


async def _query(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).query(a["name"], a.get("arg"))


async def _update(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).update(
        a["name"], a.get("arg"), id=a.get("update_id"), accepted=a.get("accepted") is True
    )


async def _result(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).result()


async def _status(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return _summary(await engine.run(a["id"]).status())


async def _describe(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).describe()  # the summary and the journal's records


async def _stream_read(engine: ServedEngine, a: dict[str, Any]) -> Any:
    """A reader's long poll (`streamRead`): the durable chunks from `from`, waiting up to
    `wait` ms (at most 30 s) for one."""
    from fusee.engine.stream_reads import read

    wait_ms = a.get("wait", 30_000)
    if type(wait_ms) is not int or not 0 <= wait_ms <= 30_000:
        raise RejectedError(f"streamRead: wait={wait_ms!r}: expected ms from 0 to 30,000")
    shard = engine.run(a["id"])._shard
    batch = await read(shard, a["id"], a["name"], a.get("from", 0), wait_ms / 1000, a.get("run"))
    answer = batch.json()
    if engine.codec is not None:  # each chunk leaves sealed, as any payload
        answer["chunks"] = [wire_out(engine.codec, raw) for raw in batch.raw]
        answer["bytes"] = []
    return answer


async def _cancel(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).cancel(a.get("reason"))


async def _terminate(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).terminate(a.get("reason"))


async def _reset(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).reset(a["before_step"], reapply_signals=a.get("reapply_signals", True))


async def _retry(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).retry()


async def _resume(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).resume()


async def _complete(engine: ServedEngine, a: dict[str, Any]) -> Any:
    await engine.complete(a["token"], a.get("value"))


async def _fail(engine: ServedEngine, a: dict[str, Any]) -> Any:
    failure = a.get("failure")  # the client's envelope (an older client sends a message)
    await engine.fail(a["token"], msgspec.convert(failure, Failure) if failure is not None else a["message"])


async def _list(engine: ServedEngine, a: dict[str, Any]) -> Any:
    return await _page(engine.list(a.get("type"), a.get("status"), where=a.get("where")), a)


async def _list_shard(engine: ServedEngine, index: int, a: dict[str, Any]) -> Any:
    shard = engine.by_index[index]
    return await _page(list_runs([shard], a.get("type"), a.get("status"), a.get("where")), a)


async def _page(rows: AsyncIterator[RunSummary], a: dict[str, Any]) -> list[dict[str, Any]]:
    """A page of a listing (the HTTP API's): the IDs that start with `prefix`, after
    `after`, in ID order, at most `limit`. Each shard sends at most a page, so the server
    merges a few rows per shard instead of every run there is. Without them, every row
    in the shard's own order, as always."""
    prefix, after, limit = a.get("prefix"), a.get("after"), a.get("limit")
    if prefix is None and after is None and limit is None:
        return [_summary(row) async for row in rows]
    if not isinstance(prefix, (str, type(None))) or not isinstance(after, (str, type(None))):
        raise RejectedError("list: prefix and after are workflow IDs (str)")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise RejectedError(f"list: limit={limit!r}: expected a count from 1")
    start = prefix or ""
    wanted = [row async for row in rows if row.id.startswith(start) and (after is None or row.id > after)]
    by_id = operator.attrgetter("id")
    chosen = heapq.nsmallest(limit, wanted, key=by_id) if limit is not None else sorted(wanted, key=by_id)
    return [_summary(row) for row in chosen]


# Calls that wait for the run rather than act on it: at a handback they are answered MOVED
# and wait again at the next holder (an update's ID makes its second sending harmless).
WAITS = frozenset({"result", "update", "streamRead"})

METHODS: dict[str, Callable[[ServedEngine, dict[str, Any]], Awaitable[Any]]] = {
    "start": _start,
    "signal_with_start": _signal_with_start,
    "update_with_start": _update_with_start,
    "signal": _signal,
    "query": _query,
    "update": _update,
    "result": _result,
    "status": _status,
    "describe": _describe,
    "streamRead": _stream_read,
    "cancel": _cancel,
    "terminate": _terminate,
    "reset": _reset,
    "retry": _retry,
    "resume": _resume,
    "complete": _complete,
    "fail": _fail,
    "list": _list,
}
