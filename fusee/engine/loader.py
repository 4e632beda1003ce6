"""Bringing runs back into memory: parked ones from their frames in the run store (read
in batches, one load per run at a time), runs waiting for their code once it is
registered, and the runs recovery rebuilds from the log; and reading a run the index
holds without loading it."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import msgspec

from fusee import journal as R
from fusee._errors import CodecError, FuseeError
from fusee._sealing import opened_frame
from fusee.engine.index import RunIndex
from fusee.engine.run import RunHost, RunState
from fusee.engine.run_reads import RunReads
from fusee.engine.shard_metrics import ShardMetrics
from fusee.engine.timers import Timers
from fusee.journal import IndexEntry, Status
from fusee.storage.contract import ShardStore

log = logging.getLogger("fusee")

# Index statuses a paused run can have: parked, or waiting for code (`fusee runs` on a
# data directory opens an engine without any).
_PAUSABLE = (Status.PARKED, Status.WAITING_FOR_CODE)


class StoredRun(msgspec.Struct):
    """A run read back from the run store, not loaded."""

    wid: str
    run_no: int
    type: str
    status: str
    journal: list[R.Rec]
    outcome: R.Finished | R.ContinuedAsNew | None
    stuck_error: None = None


class LoaderHost(RunHost, Protocol):
    """What loading needs of its shard: the runs in memory and the index it moves them
    between, the store it reads frames from, and how to stop the shard when a frame
    cannot be read. A run it revives is the shard's (`RunHost`)."""

    @property
    def index(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def stop_error(self) -> FuseeError | None: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def runs(self) -> dict[str, RunState]: ...
    @property
    def index_entries(self) -> RunIndex: ...
    @property
    def timers(self) -> Timers: ...
    @property
    def types_without_code(self) -> set[str]: ...
    @property
    def appended(self) -> int: ...
    @property
    def counts(self) -> ShardMetrics: ...
    def check(self) -> None: ...
    def stopped_error(self) -> FuseeError: ...
    def fail(self, exc: BaseException, why: str = ...) -> None: ...
    def poke(self) -> None: ...
    def start_ticks(self) -> None: ...


class RunLoader:
    """The shard's loads: each run is read at most once at a time (`loading`, which
    idleness and a stop read too), and reads asked for in one loop turn leave together."""

    def __init__(self, shard: LoaderHost) -> None:
        self.shard = shard
        # A call's load by workflow ID, a wake-up's by index key (all it knows). A call
        # joins a wake-up's load of its run (a result() routed to the worker its timer
        # invoked would read the frame a second time); a wake-up never waits on a call's
        # read, which may describe a run that is gone by the time it is back.
        self.loading: dict[int | str, asyncio.Future[RunState | None]] = {}
        self.reads = RunReads(lambda: shard.store)  # a loop turn's loads read together

    async def load(self, wid: str) -> RunState | None:
        """The run of `wid` in memory, loading (replaying) a parked one first. None only
        if, when it returns, `wid` has no run in memory and none parked: it ended (its
        index entry says how), or never ran here.

        Race: while the frame is read, the run's timer may wake it (a load of its own),
        and the run may finish or park again (a new frame) before this read is back. The
        frame in hand then describes a run that is gone, and the load looks again: a
        caller told "no run" would refuse a running run as not found, wait on a finished
        one for ever, or drop a child's result meant for its parent."""
        while True:
            run = self.shard.runs.get(wid)
            if run is not None:
                return run
            entry = self.shard.index_entries.get(wid)
            if entry is None or entry.status not in (Status.PARKED, Status.WAITING_FOR_CODE):
                return None
            run = await self._load_entry(entry, wid)
            if run is not None:
                return run
            now = self.shard.index_entries.get(wid)
            if now is not None and now.ref == entry.ref and now.status == entry.status:
                return None  # unchanged: its hash is another ID's, this one has no parked run

    async def _load_entry(self, entry: IndexEntry, wid: str) -> RunState | None:
        return (await self._load_entries([(entry, wid)]))[0]

    async def _load_entries(self, wanted: list[tuple[IndexEntry, str]]) -> list[RunState | None]:
        """Load parked runs, their frames read in one batch (a mass wake-up makes one
        round trip to the run store, not one per run). A run already being loaded is
        waited for, not read twice."""
        self.shard.check()
        loop = asyncio.get_running_loop()
        results: list[RunState | None] = [None] * len(wanted)
        unopened: list[CodecError] = []
        mine: list[tuple[int, IndexEntry, str, int | str, asyncio.Future[RunState | None]]] = []
        others: list[tuple[int, str, asyncio.Future[RunState | None]]] = []
        for i, (entry, wid) in enumerate(wanted):
            name = wid or entry.key
            waiting = self.loading.get(name) or (self.loading.get(entry.key) if wid else None)
            if waiting is not None:
                others.append((i, wid, waiting))
            else:
                fut = self.loading[name] = loop.create_future()
                mine.append((i, entry, wid, name, fut))
        try:
            if mine:
                try:
                    data = await self.reads.read([entry.ref for _, entry, _, _, _ in mine])
                    frames = [self._opened(frame) for frame in data]
                except Exception as error:  # noqa: BLE001 - an unreadable frame stops the shard
                    if self.shard.closed or self.shard.stop_error is not None:
                        # Closed or stopped while the read waited for its batch to leave:
                        # the store is gone, which is no damage worth a log line.
                        raise self.shard.stopped_error() from None
                    log.error(
                        "shard %d: a run-store frame cannot be read, the shard stops: %s",
                        self.shard.index,
                        error,
                    )
                    self.shard.fail(error, "stopped after a run-store frame could not be read")
                    raise self.shard.stopped_error() from None
                if self.shard.closed:
                    raise self.shard.stopped_error()
                for (i, entry, wid, _, fut), frame in zip(mine, frames, strict=True):
                    if isinstance(frame, CodecError):
                        # Its payloads cannot be opened here (a key missing, no codec): this
                        # run stays parked, the shard and its other runs go on.
                        unopened.append(frame)
                        if not fut.done():
                            fut.set_exception(frame)
                            fut.exception()
                        continue
                    results[i] = run = self._loaded(entry, wid, frame)
                    if not fut.done():
                        fut.set_result(run)
        except BaseException as error:
            for _, _, _, _, fut in mine:
                if not fut.done():
                    fut.set_exception(error)
                    fut.exception()  # retrieved: the caller that raised reports it
            raise
        finally:
            for _, _, _, name, _ in mine:
                del self.loading[name]
            self.shard.poke()
        for i, wid, waiting in others:
            run = await waiting
            # Another ID's run under the same hash: this one has no parked run.
            results[i] = run if run is None or not wid or run.wid == wid else None
        if unopened:
            if len(wanted) == 1:
                raise unopened[0]  # the caller of this run's load hears why
            for failed in unopened:
                log.warning("shard %d: a parked run stays parked: %s", self.shard.index, failed.message)
        return results

    def _opened(self, data: bytes) -> R.Frame | CodecError:
        try:
            return opened_frame(self.shard.engine.codec, data)
        except CodecError as error:
            return error

    def _loaded(self, entry: IndexEntry, wid: str, frame: R.Frame) -> RunState | None:
        if wid and frame.wid != wid:
            return None  # the hash belongs to another ID: this one has no parked run
        if frame.wid in self.shard.runs:
            return self.shard.runs[frame.wid]
        current = self.shard.index_entries.get(frame.wid)
        if current is None or current.ref != entry.ref or current.status != entry.status:
            return self.shard.runs.get(frame.wid)  # loaded, finished or re-parked meanwhile
        self.shard.index_entries.pop(frame.wid)
        return self.revive(frame.wid, frame.run, frame.records)

    async def wake(self, keys: list[int]) -> None:
        """Load parked runs whose timers came due (a task of their own), in one batch. A
        stopped or closed shard has nothing to wake; due times stay in its index and
        checkpoint."""
        wanted = []
        for key in keys:
            entry = self.shard.index_entries.get_key(key)
            if entry is not None and entry.status == Status.PARKED:
                wanted.append((entry, ""))
        if not wanted:
            return
        try:
            await self._load_entries(wanted)
        except FuseeError:
            pass

    def revive(self, wid: str, run_no: int, records: list[R.Rec]) -> RunState:
        """Rebuild a run from its journal: replay, then start what was left unfinished."""
        started = records[0]
        assert isinstance(started, R.Started)
        run = RunState(self.shard, wid, run_no, started)
        run.last_lsn = self.shard.appended
        run.last_active_ms = self.shard.now_ms()
        self.shard.runs[wid] = run
        self.shard.start_ticks()
        if run.workflow is None:
            run.journal = list(records)
            run.status = Status.WAITING_FOR_CODE
            self.shard.types_without_code.add(started.type)
            if started.deadline and not any(isinstance(r, (R.Finished, R.ContinuedAsNew)) for r in records):
                run.timers[-1] = started.deadline
                self.shard.timers.add(started.deadline, run, -1)
            return run
        run.replay(records)
        self.shard.counts.steps_replayed += sum(1 for rec in records if type(rec) is R.StepDone)
        if run.final:
            return run
        if run.status == Status.STUCK:
            return run
        if started.deadline:
            self.shard.timers.add(started.deadline, run, -1)
        run.traced(self.shard.index)
        run.go_live()
        return run

    async def resume_type(self, type_: str) -> None:
        """Code for `type_` was registered: its runs waiting for code replay and go on,
        whether loaded or only in the index."""
        waiting = [
            r for r in self.shard.runs.values() if r.status == Status.WAITING_FOR_CODE and r.type == type_
        ]
        for run in waiting:
            if self.shard.runs.get(run.wid) is run and not self.shard.closed:
                del self.shard.runs[run.wid]
                run.close_fibers()
                self.revive(run.wid, run.run_no, run.journal)
        for entry in list(self.shard.index_entries.entries()):
            if entry.status == Status.WAITING_FOR_CODE and entry.type == type_ and not self.shard.closed:
                await self._load_entry(entry, "")
        if not any(r.status == Status.WAITING_FOR_CODE and r.type == type_ for r in self.shard.runs.values()):
            self.shard.types_without_code.discard(type_)

    async def finished_run(self, wid: str) -> StoredRun | None:
        """A run the index holds (finished, parked or waiting for code), read back from
        the run store without loading it: its journal and, if it ended, its end."""
        entry = self.shard.index_entries.get(wid)
        if entry is None:
            return None
        frame = opened_frame(self.shard.engine.codec, (await self.reads.read([entry.ref]))[0])
        if frame.wid != wid:
            return None
        last = frame.records[-1]
        outcome = last if isinstance(last, (R.Finished, R.ContinuedAsNew)) else None
        return StoredRun(wid, frame.run, entry.type, entry.status, frame.records, outcome)

    async def indexed(self) -> list[tuple[str, IndexEntry]]:
        """Every index entry with its workflow ID, read from its frame (for listings): one
        batch of run-store reads."""
        entries = list(self.shard.index_entries.entries())
        out = []
        for entry, data in zip(
            entries, await self.shard.store.get_runs([e.ref for e in entries]), strict=True
        ):
            frame = R.decode_frame(data)
            entry.wid = frame.wid
            first = frame.records[0] if frame.records else None
            if not entry.started and isinstance(first, R.Started):
                entry.started = first.now  # for a filter on startedMs
            if entry.status in _PAUSABLE and R.pauses(frame.records):
                entry.status = Status.PAUSED  # a copy: the index keeps its own status
            out.append((frame.wid, entry))
        return out
