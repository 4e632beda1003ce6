"""A worker process of the model test's server mode: `python -m tests.model.server_worker
ADDRESS`. It opens an engine in server mode with the model's workflows (workflows.py) and
prints a line per shard it takes or loses (`took N`, `lost N`). When its connection goes
(the server was killed, or it was deposed while stopped) it opens a new engine, as a
deployed worker would (`reconnected`). SIGTERM closes it.

What the model's workflows do outside the engine lands in files the test reads, since the
test's own `LEDGER` is in another process (FUSEE_MODEL_DIR):

- `ledger`: a line per step function call, `call KEY ATTEMPT LIFETIME VALUE` (or `gate`
  for a gated step), appended with one write before the function returns; a line per
  completion token, `token WID TOKEN`; a line per compensation a run reached, `comp WID
  RUN NAME`. LIFETIME is `PID.N`: the N-th engine this process opened, the test's epoch.
- `valve/open-G`: the G-th opening of the valve; a gated step waits for the first opening
  after it started, as on the in-process model's `LEDGER.valve`.

The worker also answers a test-only call, `model.journal`: a run's summary and journal as
`Run.describe()` returns them in process (only once every record behind them is durable).
A Client's `describe` carries the summary alone; the model's checks read the journal."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import fusee
from fusee import journal as R
from fusee.engine import remote_calls
from tests.model import workflows as W
from tests.support.workers import print_shards

TIMED_MS = 3_000  # model.timed's workflow timeout here (20 s in process, on a virtual clock)

DIR = Path(os.environ.get("FUSEE_MODEL_DIR", "."))
LIFETIME = [f"{os.getpid()}.0"]
VALUES = itertools.count(1)


def _append(line: str) -> None:
    """One write of one line (O_APPEND): lines of several processes never interleave, and
    a line written is in the file whatever happens to this process afterwards."""
    fd = os.open(DIR / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _call(key: str, attempt: int, epoch: int, kind: str = "call") -> int:
    """The step function's call, as `Ledger.call`: a value unique over every process."""
    value = os.getpid() * 1_000_000 + next(VALUES)
    _append(f"{kind} {key} {attempt} {os.getpid()}.{epoch} {value}")
    return value


class FileValve:
    """`LEDGER.valve` across processes: `wait()` returns once the valve opened after it
    was called (the test creates `valve/open-G`)."""

    async def wait(self) -> None:
        valve = DIR / "valve"
        generation = 0
        while (valve / f"open-{generation}").exists():
            generation += 1
        while not (valve / f"open-{generation}").exists():
            await asyncio.sleep(0.02)


def _gated() -> Any:
    epoch = W.LEDGER.epoch

    async def _gated_fn(s: fusee.StepContext) -> int:
        value = _call(s.key, s.attempt, epoch, "gate")
        await FileValve().wait()
        return value

    return _gated_fn


def _send_token(wid: str) -> Any:
    def send(cb: fusee.Completion) -> None:
        _append(f"token {wid} {cb.token}")

    return send


class Spy:
    """The workflow context, with each compensation the run reaches written down (the
    in-process model reads `LEDGER.comps`)."""

    def __init__(self, ctx: fusee.Ctx) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def compensate(self, name: str, fn: Any) -> Any:
        _append(f"comp {self._ctx.workflow_id} {self._ctx.run_number} {name}")
        return self._ctx.compensate(name, fn)


async def _plan(ctx: fusee.Ctx, plan: W.Plan) -> int:
    return await W.interpret(Spy(ctx), plan, "s")  # type: ignore[arg-type]


async def _plan_changed(ctx: fusee.Ctx, plan: W.Plan) -> int:
    return await W.interpret(Spy(ctx), plan, "x")  # type: ignore[arg-type]


CODE = {
    "right": [fusee.workflow(W.PLAN_TYPE)(_plan), fusee.workflow(W.TIMED_TYPE, timeout=TIMED_MS)(_plan)],
    "changed": [
        fusee.workflow(W.PLAN_TYPE)(_plan_changed),
        fusee.workflow(W.TIMED_TYPE, timeout=TIMED_MS)(_plan_changed),
    ],
    "absent": [fusee.workflow(W.PLAN_TYPE)(_plan)],
}


async def _journal(engine: fusee.Engine, a: dict[str, Any]) -> Any:
    """The run's summary and its records, each encoded as a journal entry."""
    described = await engine.run(a["id"]).describe()
    row = described.summary
    return {
        "run": row.run,
        "status": row.status,
        "records": [R.encode_entry(R.Entry(row.id, row.run, rec)) for rec in described.journal],
    }


def install() -> None:
    W.LEDGER.call = _call  # type: ignore[method-assign]
    W._gated = _gated
    W._send_token = _send_token
    W.LEDGER.valve = FileValve()  # type: ignore[assignment]
    remote_calls.METHODS["model.journal"] = _journal


async def watch(engine: fusee.Engine, stop: asyncio.Event) -> None:
    held: set[int] = set()
    storage = engine.storage
    while not stop.is_set() and getattr(storage, "lost", None) is None:
        held = print_shards(engine, held)
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    for index in sorted(held):
        if stop.is_set():
            break
        print("lost", index, flush=True)


async def main(address: str, code: str) -> None:
    install()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    first = True
    while not stop.is_set():
        W.LEDGER.epoch += 1  # a new engine: step functions it makes carry its lifetime
        try:
            engine = await fusee.Engine.open(
                durability="server", address=address, workflows=CODE[code], park_after="200ms"
            )
        except fusee.ConnectionError:
            await asyncio.sleep(0.1)
            continue
        # This worker opens a new engine per connection, so that each has its own lifetime;
        # the engine's own reconnect (docs/server.md, *Reconnecting*) would keep one.
        engine.storage.reconnects = False  # type: ignore[attr-defined]
        LIFETIME[0] = f"{os.getpid()}.{W.LEDGER.epoch}"
        if first:
            print("ready", LIFETIME[0], " ".join(str(s.index) for s in engine.shards), flush=True)
            first = False
        else:
            print("reconnected", LIFETIME[0], flush=True)
        await watch(engine, stop)
        if stop.is_set():
            await engine.close()
        else:
            print("disconnected", LIFETIME[0], flush=True)
            engine.abandon()
            await engine.storage.abandon()  # type: ignore[attr-defined]
    print("closed", flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s worker %(name)s: %(message)s"
    )
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "right"))
