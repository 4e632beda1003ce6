"""A worker engine in server mode: it takes the shards a standby is granted while it
runs, and answers the calls the server relays to it from clients.

A call names its method and carries its arguments as a MessagePack map; the answer is
the method's value, or the error's code and message (and a recorded failure's envelope),
so a client raises the same error the engine would have raised in process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fusee._errors import ConnectionError, FuseeError, RejectedError, _FailureError
from fusee.protocol import messages as m
from fusee.protocol.frames import FrameError
from fusee.storage.remote import RemoteStorage

if TYPE_CHECKING:
    from fusee.engine.engine import Engine

logger = logging.getLogger("fusee.worker")

_encode = msgspec.msgpack.encode


class CallServer:
    def __init__(self, engine: Engine, storage: RemoteStorage) -> None:
        self.engine = engine
        self.storage = storage
        self.attaching: dict[int, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
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
        self.attaching[index] = self._spawn(self._attach(index))

    async def _attach(self, index: int) -> None:
        try:
            await self.engine.attach(index)
            logger.info("shard %d: taken over (epoch %d)", index, self.storage.granted.get(index, 0))
        except FuseeError as error:
            logger.warning("shard %d: could not take it over: %s", index, error)
            # Let the lease go, or the shard would stay with a holder that runs nothing.
            self.storage.release(index)
        finally:
            self.attaching.pop(index, None)

    def called(self, call: m.Call) -> None:
        self._spawn(self._answer(call))

    async def _answer(self, call: m.Call) -> None:
        try:
            attaching = self.attaching.get(call.shard)
            if attaching is not None:
                await asyncio.wait([attaching])  # the server routed it here: the lease is ours
            if call.shard >= 0 and (self.engine.closed or call.shard not in self.engine.by_index):
                # Let go (or being let go: the engine closing) before the server heard: it
                # routes the call again, to the next holder, instead of the caller getting
                # a refusal.
                self.storage.send(m.Answer(call.rid, code=m.MOVED, message=f"shard {call.shard} let go"))
                return
            if self.engine.closed:  # a listing: asked again, it goes to the shards' next holders
                raise ConnectionError("the worker is closing; retry")
            method = METHODS.get(call.method)
            if method is None:
                raise RejectedError(f"no call {call.method!r} (expected one of {', '.join(sorted(METHODS))})")
            args = m.decode_value(call.args)
            if not isinstance(args, dict):
                raise RejectedError("a call's arguments are a map")
            value = await method(self.engine, args)
            answer = m.Answer(call.rid, _encode(value))
        except _FailureError as error:
            cause = _encode(error.cause) if error.cause is not None else b""
            answer = m.Answer(call.rid, cause, error.code, error.message)
        except FuseeError as error:
            answer = m.Answer(call.rid, b"", error.code, error.message)
        except (TypeError, ValueError, KeyError, msgspec.ValidationError) as error:
            answer = m.Answer(call.rid, b"", RejectedError.code, f"call {call.method!r}: {error!r}")
        try:
            self.storage.send(answer)
        except FrameError as error:  # a value over the frame limit
            self.storage.send(m.Answer(call.rid, b"", RejectedError.code, f"call {call.method!r}: {error}"))


def _summary(row: Any) -> dict[str, Any]:
    return {"id": row.id, "run": row.run, "type": row.type, "status": row.status, "shard": row.shard}


async def _start(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.start(
        a["type"], a["id"], a.get("input"), id_policy=a.get("id_policy"), timeout=a.get("timeout")
    )
    return {"id": a["id"]}


async def _signal_with_start(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.signal_with_start(a["type"], a["id"], a.get("input"), a["signal"], a.get("value"))
    return {"id": a["id"]}


async def _update_with_start(engine: Engine, a: dict[str, Any]) -> Any:
    _, value = await engine.update_with_start(
        a["type"], a["id"], a.get("input"), a["update"], a.get("arg"), update_id=a.get("update_id")
    )
    return value


async def _signal(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).signal(a["name"], a.get("value"))


async def _query(engine: Engine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).query(a["name"], a.get("arg"))


async def _update(engine: Engine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).update(a["name"], a.get("arg"), id=a.get("update_id"))


async def _result(engine: Engine, a: dict[str, Any]) -> Any:
    return await engine.run(a["id"]).result()


async def _describe(engine: Engine, a: dict[str, Any]) -> Any:
    return _summary((await engine.run(a["id"]).describe()).summary)


async def _cancel(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).cancel(a.get("reason"))


async def _terminate(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.run(a["id"]).terminate(a.get("reason"))


async def _complete(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.complete(a["token"], a.get("value"))


async def _fail(engine: Engine, a: dict[str, Any]) -> Any:
    await engine.fail(a["token"], a["message"])


async def _list(engine: Engine, a: dict[str, Any]) -> Any:
    return [_summary(row) async for row in engine.list(a.get("type"), a.get("status"))]


METHODS: dict[str, Callable[[Engine, dict[str, Any]], Awaitable[Any]]] = {
    "start": _start,
    "signal_with_start": _signal_with_start,
    "update_with_start": _update_with_start,
    "signal": _signal,
    "query": _query,
    "update": _update,
    "result": _result,
    "describe": _describe,
    "cancel": _cancel,
    "terminate": _terminate,
    "complete": _complete,
    "fail": _fail,
    "list": _list,
}
