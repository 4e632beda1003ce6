"""The invocation handler the model test's invoked mode runs: `python -m uvicorn
tests.model.invoke_handler_app:app --host 127.0.0.1 --port PORT`, a fresh process on the
same port after each SIGKILL (as a platform starts a new instance).

It is `fusee.invocation_handler` with the model's workflows, set up as
`server_worker.install` sets up a long-lived worker (the ledger file, the file valve, the
test-only `model.journal` call), configured by the environment: FUSEE_URL (the server),
FUSEE_INVOKE_SECRET_FILE, FUSEE_MODEL_DIR (the ledger and the valve), FUSEE_INVOKE_TRACE.

Around it, for the test to see what a platform would:

- Each request is one engine's lifetime, `PID.N` (N counts this process's requests): step
  functions built while it runs carry it (a context variable that the engine's tasks
  inherit from the request's), as a long-lived worker's carry `PID.EPOCH`. The ledger gets
  `ended PID.N` once the request is answered, and `gatedone KEY ATTEMPT PID.N` when a gated
  step function returns: one that returns after its invocation ended must never be the
  recorded value (the invocation's lease is gone). A gated step waits for the valve's
  first opening after the attempt first began, in any invocation (`_generation`).
- `request N begin` and `request N end STATUS` on standard output bracket every request,
  so the test knows when none is in flight.
- `GET /model/tasks` answers (outside any invocation) the asyncio tasks and threads left in
  the process, for the test to see what outlives the invocations."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import itertools
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import fusee
from fusee.invoke import InvocationHandler
from tests.model import server_worker as SW
from tests.model import workflows as W

EPOCH: contextvars.ContextVar[int] = contextvars.ContextVar("model_invocation", default=0)
REQUESTS = itertools.count(1)
DRAFTS = itertools.count(1)


class InvocationLedger(W.Ledger):
    """`LEDGER.epoch` is the current invocation's number (0 outside any): step functions
    capture it when the workflow code builds them."""

    @property
    def epoch(self) -> int:
        return EPOCH.get()

    @epoch.setter
    def epoch(self, value: int) -> None:
        pass  # (the dataclass's __init__ sets it)


def _generation(key: str, attempt: int) -> int:
    """The valve opening a gated step attempt waits for: the first after the attempt first
    began, in whichever invocation (written down then, in `valve/`). An attempt handed
    back at a budget's end runs again in the next invocation and passes at once if the
    valve opened meanwhile, as slow work that finished while the shard moved would."""
    valve = SW.DIR / "valve"
    marker = valve / f"gate-{hashlib.sha1(f'{key} {attempt}'.encode()).hexdigest()[:20]}"
    if not marker.exists():
        generation = 0
        while (valve / f"open-{generation}").exists():
            generation += 1
        draft = valve / f"{marker.name}.{os.getpid()}.{next(DRAFTS)}"
        draft.write_text(str(generation))
        try:
            os.link(draft, marker)  # (the first one wins, whole)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return int(marker.read_text())


async def _valve(generation: int) -> None:
    while not (SW.DIR / "valve" / f"open-{generation}").exists():
        await asyncio.sleep(0.02)


def _gated() -> Any:
    epoch = W.LEDGER.epoch

    async def _gated_fn(s: fusee.StepContext) -> int:
        value = SW._call(s.key, s.attempt, epoch, "gate")
        await _valve(_generation(s.key, s.attempt))
        SW._append(f"gatedone {s.key} {s.attempt} {os.getpid()}.{epoch}")
        return value

    return _gated_fn


def _install() -> None:
    W.LEDGER = InvocationLedger()
    SW.install()
    W._gated = _gated


def _handler() -> InvocationHandler:
    secret = Path(os.environ["FUSEE_INVOKE_SECRET_FILE"]).read_bytes().strip()
    return fusee.invocation_handler(os.environ["FUSEE_URL"], workflows=SW.CODE["right"], secret=secret)


def _left() -> dict[str, Any]:
    """Every task but this one, and every thread but the main one."""
    me = asyncio.current_task()
    tasks = []
    for task in asyncio.all_tasks():
        if task is me:
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        tasks.append({"name": getattr(coro, "__qualname__", repr(coro)), "where": where})
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return {"tasks": tasks, "threads": threads}


class App:
    def __init__(self) -> None:
        _install()
        self.handler = _handler()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.handler(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/model/tasks":
            body = json.dumps(_left()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        number = next(REQUESTS)
        EPOCH.set(number)
        print(f"request {number} begin", flush=True)
        status: list[int] = []

        async def sent(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.handler(scope, receive, sent)
        finally:
            SW._append(f"ended {os.getpid()}.{number}")
            print(f"request {number} end {status[0] if status else '-'}", flush=True)


logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s handler %(name)s: %(message)s")
app = App()
