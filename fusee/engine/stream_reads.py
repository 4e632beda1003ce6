"""Reading a run's stream (docs/engine.md, *Streams*): chunks from an offset, only once
they are durable, so a crash never takes back a chunk a reader saw; waiting (a long poll)
while the stream grows; ended once the stream is complete and every chunk is read.

A loaded run is read in memory; a parked or finished one from its stored journal. A
reader stays on the run it began on: when the ID moves on (continue-as-new, a reset),
the stream it followed ends with that run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fusee import _codec as codec
from fusee import journal as R
from fusee._errors import NotFoundError, RejectedError
from fusee.engine.shard import Shard
from fusee.engine.streams import StreamState

LONG_POLL_S = 30.0  # a read's default wait for a chunk
LOOK_AGAIN_S = 1.0  # a wait looks again this often: the run may have parked or ended meanwhile


class Batch:
    """What one read answers: the chunks from `start` (values), and the end once the
    stream is complete and `next` is past its last chunk."""

    __slots__ = ("chunks", "end", "next", "raw", "run", "start")

    def __init__(self, run: int, start: int, chunks: list[bytes], end: tuple[str, bool] | None) -> None:
        self.run = run
        self.start = start
        self.raw = chunks  # as recorded (payload bytes)
        self.chunks = [codec.decode(chunk, Any, "a stream chunk") for chunk in chunks]
        self.next = start + len(chunks)
        self.end = end

    def json(self) -> dict[str, Any]:
        """The batch as every client reads it: `{run, from, next, chunks, bytes, end}`."""
        return {
            "run": self.run,
            "from": self.start,
            "next": self.next,
            "chunks": self.chunks,
            "bytes": [i for i, chunk in enumerate(self.chunks) if isinstance(chunk, bytes)],
            "end": None if self.end is None else {"status": self.end[0], "closed": self.end[1]},
        }


async def read(
    shard: Shard, wid: str, name: str, start: int = 0, wait_s: float = LONG_POLL_S, run_no: int | None = None
) -> Batch:
    """The durable chunks of stream `name` of run `wid` from offset `start`, waiting up
    to `wait_s` for one; `run_no` keeps the read on the run it began on."""
    if type(start) is not int or start < 0:
        raise RejectedError(f"stream read from {start!r}: expected an offset from 0")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait_s)
    while True:
        shard.check()
        run = shard.runs.get(wid)
        waiting: asyncio.Event | None = None
        if run is not None and (run_no is None or run.run_no == run_no):
            run_no = run.run_no
            state = run.streams.get(name)
            if state is None:
                state = run.streams[name] = StreamState()  # a reader waits for its writer
            chunks, lsns, end_lsn = state.chunks, state.lsns, state.end_lsn
            end = (state.end.status, state.end.closed) if state.end is not None else None
            if end is None and run.final:
                end = (str(run.status), False)  # ended with the stream never opened
            if end is None:
                waiting = state.waiting = state.waiting or asyncio.Event()
        else:
            stored = await shard.finished_run(wid)
            if stored is None or (run_no is not None and stored.run_no != run_no):
                if run_no is not None:
                    return Batch(run_no, start, [], ("continued", False))  # the ID moved on
                raise NotFoundError(f"no workflow '{wid}'", workflow_id=wid)
            run_no = stored.run_no
            chunks, end = _stored(stored.journal, name, stored.outcome)
            lsns, end_lsn = [0] * len(chunks), 0
        durable = shard.durable
        ready = start
        while ready < len(chunks) and lsns[ready] <= durable:
            ready += 1
        if ready > start:
            return Batch(
                run_no,
                start,
                chunks[start:ready],
                end if ready == len(chunks) and end_lsn <= durable else None,
            )
        if start < len(chunks):
            await shard.durable_at(lsns[start])  # appended, not durable yet: soon
            continue
        if end is not None:
            if end_lsn > durable:
                await shard.durable_at(end_lsn)
                continue
            return Batch(run_no, start, [], end)
        left = deadline - loop.time()
        if left <= 0:
            return Batch(run_no, start, [], None)
        if waiting is None:
            await asyncio.sleep(min(left, LOOK_AGAIN_S))  # parked: it is loaded to grow
        else:
            try:
                await asyncio.wait_for(waiting.wait(), min(left, LOOK_AGAIN_S))
            except TimeoutError:
                pass


def _stored(journal: list[R.Rec], name: str, outcome: Any) -> tuple[list[bytes], tuple[str, bool] | None]:
    chunks: list[bytes] = []
    end: tuple[str, bool] | None = None
    for rec in journal:
        if type(rec) is R.StreamChunk and rec.stream == name:
            chunks.append(rec.value)
        elif type(rec) is R.StreamEnd and rec.stream == name:
            end = (rec.status, rec.closed)
    if end is None and outcome is not None:
        end = (outcome.status if isinstance(outcome, R.Finished) else "continued", False)
    return chunks, end


class ChunkReader:
    """An async iterator over a stream's chunks, a batch at a time from `_batch` (the
    engine's read, or a client's `streamRead`): `offset` is where to reconnect, `status`
    and `closed` how it ended (None while it goes on)."""

    def __init__(self, name: str, from_: int) -> None:
        self.name = name
        self.offset = from_
        self.status: str | None = None
        self.closed = False
        self._run: int | None = None  # the run it began on: it stays on that one
        self._buffer: list[Any] = []
        self._ending: tuple[str, bool] | None = None

    async def _batch(self) -> tuple[int, list[Any], tuple[str, bool] | None]:
        """(the run's number, the chunks from `offset`, the end once reached)."""
        raise NotImplementedError

    def __aiter__(self) -> ChunkReader:
        return self

    async def __anext__(self) -> Any:
        while not self._buffer:
            if self.status is not None:
                raise StopAsyncIteration
            self._run, self._buffer, end = await self._batch()
            if end is not None and not self._buffer:
                self.status, self.closed = end
                raise StopAsyncIteration
            self._ending = end
        self.offset += 1
        value = self._buffer.pop(0)
        if not self._buffer and self._ending is not None:
            self.status, self.closed = self._ending
        return value


class StreamReader(ChunkReader):
    """`run.stream(name, from_=)` on an engine."""

    def __init__(self, shard_of: Any, wid: str, name: str, from_: int = 0) -> None:
        super().__init__(name, from_)
        self._shard_of = shard_of
        self.id = wid

    async def _batch(self) -> tuple[int, list[Any], tuple[str, bool] | None]:
        batch = await read(self._shard_of(), self.id, self.name, self.offset, LONG_POLL_S, self._run)
        return batch.run, list(batch.chunks), batch.end
