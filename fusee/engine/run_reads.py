"""A shard's run-store reads, gathered per turn of the event loop.

Calls relayed to a shard arrive in bursts: a client waiting on a hundred results, a
listing's describes, an invocation opening while calls wait at the server. Each call
that needs a parked or finished run reads its frame; read one by one, a burst of 25
costs 25 requests to the run store (over the network in server mode, each a round trip
through the server's disk thread). Reads asked for during one loop turn leave together
at the end of it as one `get_runs`, and each asker gets its own frames back. A frame
asked for twice in one turn (a woken run's load and a result() call's, as an invocation
opens) is read once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fusee.storage.contract import ShardStore

Batch = list[tuple[list[int], "asyncio.Future[list[bytes]]"]]


class RunReads:
    def __init__(self, store: Callable[[], ShardStore]) -> None:
        self.store = store  # the shard's store, looked up when a batch leaves
        self.pending: Batch = []
        self.in_flight: set[asyncio.Future[list[bytes]]] = set()  # referenced until done

    async def read(self, refs: list[int]) -> list[bytes]:
        """The frames at `refs` (run-store offsets), in order."""
        if not refs:
            return []
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[bytes]] = loop.create_future()
        self.pending.append((refs, fut))
        if len(self.pending) == 1:
            loop.call_soon(self._send)
        return await fut

    def _send(self) -> None:
        batch, self.pending = self.pending, []
        batch = [(refs, fut) for refs, fut in batch if not fut.done()]  # askers cancelled meanwhile
        if not batch:
            return
        unique = list(dict.fromkeys(ref for refs, _ in batch for ref in refs))
        try:
            reading = self.store().get_runs(unique)
        except Exception as error:  # noqa: BLE001 - a closed store: every asker gets its error
            _fail(batch, error)
            return
        task: asyncio.Future[list[bytes]] = asyncio.ensure_future(reading)
        self.in_flight.add(task)
        task.add_done_callback(lambda done: self._split(batch, unique, done))

    def _split(self, batch: Batch, unique: list[int], done: asyncio.Future[list[bytes]]) -> None:
        self.in_flight.discard(done)
        if done.cancelled():  # the loop is shutting down
            for _, fut in batch:
                fut.cancel()
            return
        error = done.exception()
        if error is not None:
            _fail(batch, error)
            return
        by_ref = dict(zip(unique, done.result(), strict=True))
        for refs, fut in batch:
            if not fut.done():
                fut.set_result([by_ref[ref] for ref in refs])


def _fail(batch: Batch, error: BaseException) -> None:
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(error)
