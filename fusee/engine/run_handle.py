"""Run handles: what a caller does with the runs of one workflow ID (signal, query,
update, result, describe, cancel, terminate), and the summaries they hand back."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import msgspec

from fusee import _codec as codec
from fusee import _names as names
from fusee import journal as R
from fusee._audit import requester
from fusee._errors import (
    Failure,
    FuseeError,
    NotFoundError,
    RejectedError,
    WorkflowError,
    error_from,
    failure_from,
)
from fusee.engine import run_ops
from fusee.engine.coordinators.calls import wait_started
from fusee.engine.coordinators.concurrency import cancel_queued, through_queue
from fusee.engine.loader import StoredRun
from fusee.engine.run import RunState
from fusee.engine.shard import Shard
from fusee.engine.where import Where
from fusee.journal import ENDED, STATUS_OF, Status
from fusee.workflow.definitions import Query, Signal, Update, Workflow, query_of, signal_of, update_of

Out = TypeVar("Out")
FINISHED = ENDED
_STUCK, _OK = Status.STUCK, Status.OK  # read on every result: module globals (enum lookups are slow on 3.11)


# The statuses a listing shows (a parked run is listed as running: it waits, as a loaded
# one does), in the order its refusal names them.
LISTED = (
    Status.RUNNING,
    Status.PAUSED,
    Status.WAITING_FOR_CODE,
    Status.STUCK,
    Status.OK,
    Status.FAILED,
    Status.CANCELLED,
    Status.TIMED_OUT,
    Status.TERMINATED,
    Status.CONTINUED,
)
_LISTED = frozenset(LISTED)


class RunSummary(msgspec.Struct):
    """A run as a listing, `status()` and `describe()` show it, the same from an engine
    and through a client: `status` is a `Status` either way (a `str` enum, so it also
    equals its value, "ok")."""

    id: str
    run: int
    type: str
    status: Status  # read from the wire or the run store as a plain str: converted there
    shard: int


def listed_status(status: Any) -> Status | None:
    """A listing's `status=` filter, refused (RejectedError naming the valid values) when
    no run could ever be listed with it: a misspelt filter would otherwise list nothing,
    which reads as "no such runs"."""
    if status is None:
        return None
    if isinstance(status, str) and status in _LISTED:
        return STATUS_OF[status]
    raise RejectedError(
        f"list(status={status!r}): not a status a run is listed with; expected one of " + ", ".join(LISTED)
    )


async def list_runs(
    shards: list[Shard],
    type: str | None,
    status: str | None,
    where: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> AsyncIterator[RunSummary]:
    """The runs of `shards` (`Engine.list`), in memory and indexed (parked, finished), of
    `type` and `status` (None: any) that `where` matches (fusee/engine/where.py), at most
    `limit`; each shard's rows leave once what they say is durable. A filter on
    attributes is answered from the index's attributes (no run-store read)."""
    wanted = listed_status(status)  # a misspelt status is refused, not an empty listing
    flt = Where(where) if where is not None else None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RejectedError(f"list(limit={limit!r}): expected a count from 1")
    left = limit
    for shard in shards:
        rows: list[RunSummary] = []
        for r in shard.runs.values():
            shown = run_ops.shown_status(r)
            if flt is None or flt.matches(r.wid, r.type, shown, r.started.now, r.attrs):
                rows.append(RunSummary(r.wid, r.run_no, r.type, shown, shard.index))
        rows = [
            row
            for row in rows
            if (type is None or row.type == type) and (wanted is None or row.status == wanted)
        ]
        seen = shard.appended
        if flt is not None and flt.attrs:
            # Answered from the index's attributes: no run-store read, and no more rows
            # built than the limit asks for.
            rows += _attributed(shard, flt, type, wanted, None if left is None else left - len(rows))
        else:
            for wid, e in await shard.indexed():
                shown = Status.RUNNING if e.status == Status.PARKED else STATUS_OF[e.status]
                if (type is None or e.type == type) and (wanted is None or shown == wanted):
                    if flt is None or flt.matches(wid, e.type, shown, e.started, e.attrs):
                        rows.append(RunSummary(wid, e.run_no, e.type, shown, shard.index))
        await shard.durable_at(seen)  # statuses leave the process once durable
        for row in rows:
            yield row
            if left is not None:
                left -= 1
                if left == 0:
                    return


def _attributed(
    shard: Shard, flt: Where, type: str | None, wanted: Status | None, most: int | None
) -> list[RunSummary]:
    """The indexed runs a filter on attributes matches, at most `most`: among those an
    equality names, or every attributed one (a run without attributes cannot match)."""
    index = shard.index_entries
    posting = flt.equality()
    keys = index.postings.get(posting, ()) if posting is not None else index.attributed.keys()
    out: list[RunSummary] = []
    if most is not None and most <= 0:
        return out
    parked, running = Status.PARKED, Status.RUNNING
    for wid, run_no, type_, status, started, attrs in index.attributed_rows(list(keys)):
        shown = running if status == parked else STATUS_OF[status]
        if (type is None or type_ == type) and (wanted is None or shown == wanted):
            if flt.matches(wid, type_, shown, started, attrs):
                out.append(RunSummary(wid, run_no, type_, shown, shard.index))
                if most is not None and len(out) >= most:
                    break
    return out


class RunDescription(msgspec.Struct):
    summary: RunSummary
    journal: list[R.Rec] = msgspec.field(default_factory=list)


class RunsOwner(Protocol):
    """What a run handle needs of its engine (`fusee/engine/engine.py`): the shard a
    workflow ID lives on, once the engine is known to be open, and the settings that
    shape answers."""

    @property
    def workflows(self) -> dict[str, Workflow[Any]]: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def record_stacks(self) -> bool: ...
    def _check_open(self) -> None: ...
    def shard_of(self, wid: str) -> Shard: ...


class Run(Generic[Out]):
    """A handle on the runs of one workflow ID; makes no call until used.

    Every answer and every refusal leaves only once the state it rests on is durable: a
    run that ended in memory refuses a signal as ended only once its end is in the log,
    so a crash cannot bring back a run the caller was told had ended."""

    def __init__(self, engine: RunsOwner, id: str, wf: Workflow[Any] | None) -> None:
        self.engine = engine
        self.id = id
        self.workflow = wf

    def __repr__(self) -> str:
        return f"<fusee.Run {self.id!r}>"

    @property
    def _shard(self) -> Shard:
        self.engine._check_open()
        return self.engine.shard_of(names.name(self.id, "workflow ID"))

    async def _refuse(self, shard: Shard, error: FuseeError) -> NoReturn:
        await shard.durable_at(shard.durability.appended)
        raise error

    async def _loaded(self, shard: Shard) -> RunState | None:
        """The run in memory (loading a parked one), having taken its first turn."""
        state = await shard.load(self.id)
        if state is not None:
            shard.turn(state)
        return state

    async def _running(self, shard: Shard) -> RunState:
        state = await self._loaded(shard)
        if state is None or state.final:
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        return state

    async def signal(self, signal: Signal[Any] | str, value: Any = None, *, id: str | None = None) -> None:
        """Record a signal; returns once it is durable. A value that does not match the
        signal's type is refused before anything is recorded. A stuck run (its code does
        not match its journal) records it too; the run takes it once its code is fixed.
        `id` makes sending it again harmless: a signal under an ID the run has recorded is
        acknowledged and not recorded twice (a retry after an error that left it unclear
        whether the first try was recorded)."""
        sig = signal_of(signal)
        names.name(sig.name, "signal name")
        if id is not None:
            names.name(id, "signal ID")
        payload = codec.convert(value, sig.type, f"signal '{sig.name}'")[0]
        await self._signal_bytes(sig.name, payload, id)

    async def _signal_bytes(self, name: str, payload: bytes, signal_id: str | None = None) -> None:
        shard = self._shard
        state = await self._running(shard)
        if signal_id is not None and signal_id in state.signal_ids:
            # Recorded by an earlier try: acknowledged once that record is durable.
            await shard.durable_at(shard.durability.appended)
            return
        state.event(R.SignalReceived(name, payload, requester(), signal_id))
        await shard.durable_at(state.last_lsn)

    async def query(self, query: Query[Any, Any] | str, arg: Any = None) -> Any:
        """Answer from the run's state; released once the state it read is durable."""
        q = query_of(query)
        names.name(q.name, "query name")
        shard = self._shard
        value = codec.convert(arg, q.arg, "query argument")[1]
        state = await self._loaded(shard)
        if state is None:
            stored = await shard.finished_run(self.id)
            if stored is None:
                await self._refuse(shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id))
            assert stored is not None
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has ended ({stored.status}); queries need a running run"
                ),
            )
        assert state is not None
        try:
            self._check_answerable(shard, state, "query")
        except RejectedError as error:
            await self._refuse(shard, error)
        if state.final:
            await self._refuse(
                shard,
                RejectedError(f"workflow '{self.id}' has ended ({state.status}); queries need a running run"),
            )
        handler = state.query_handlers.get(q.name)
        if handler is None:
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has no handler for query '{q.name}' "
                    f"(handlers: {', '.join(sorted(state.query_handlers)) or 'none'})"
                ),
            )
        assert handler is not None
        try:
            answer = handler[1](value)
        except Exception as exc:  # noqa: BLE001 - the handler's failure, as an envelope
            await self._refuse(shard, WorkflowError(failure_from(exc, self.engine.record_stacks)))
        if inspect.isawaitable(answer):
            _close(answer)
            await self._refuse(
                shard, RejectedError(f"query '{q.name}': a query handler must be a plain function, not async")
            )
        data = codec.encode(answer, f"query '{q.name}' answer")
        await shard.durable_at(state.last_lsn)
        return codec.decode(data, q.result, f"query '{q.name}' answer")

    def _check_answerable(self, shard: Shard, state: RunState, what: str) -> None:
        """A run whose code cannot run here has no handlers to ask (checked before the
        durability wait of the refusal, which the caller does)."""
        if state.status == Status.STUCK and state.stuck_error is not None:
            raise RejectedError(f"{what} refused: {state.stuck_error.message}")
        if state.status == Status.WAITING_FOR_CODE:
            raise RejectedError(
                f"{what} refused: workflow '{self.id}' waits for the code of its type '{state.type}', "
                "which this engine does not have registered"
            )

    async def update(
        self,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id: str | None = None,
        accepted: bool = False,
    ) -> Any:
        """Run an update's handler in the workflow. The validator runs first (a refusal
        records nothing); the same update ID gets the recorded result. With `accepted`,
        None once the update is accepted and durable (its handler runs on)."""
        u = update_of(update)
        names.name(u.name, "update name")
        update_id = names.name(id, "update ID") if id is not None else str(uuid.uuid4())
        shard = self._shard
        data, value = codec.convert(arg, u.arg, f"update '{u.name}' argument")
        state = await self._loaded(shard)
        if state is None:
            finished = await shard.finished_run(self.id)
            done = finished and next(
                (r for r in finished.journal if isinstance(r, R.UpdateDone) and r.id == update_id), None
            )
            if done:
                return None if accepted else _update_result(u, done)
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        done = _recorded_update(state, update_id)
        if done is not None:
            await shard.durable_at(state.last_lsn)
            return None if accepted else _update_result(u, done)
        if state.final:
            await self._refuse(shard, NotFoundError(f"no running workflow '{self.id}'", workflow_id=self.id))
        if update_id in state.updates_accepted:
            if accepted:
                await shard.durable_at(state.last_lsn)
                return None
            return _update_result(u, await self._update_waiter(shard, update_id))
        try:
            self._check_answerable(shard, state, f"update '{u.name}'")
        except RejectedError as error:
            await self._refuse(shard, error)
        handler = state.update_handlers.get(u.name)
        if handler is None:
            await self._refuse(
                shard,
                RejectedError(
                    f"workflow '{self.id}' has no handler for update '{u.name}' "
                    f"(handlers: {', '.join(sorted(state.update_handlers)) or 'none'})"
                ),
            )
        assert handler is not None
        validate = handler[2]
        if validate is not None:
            try:
                verdict = validate(value)
            except Exception as exc:  # noqa: BLE001 - a refusal, whatever its type
                await self._refuse(shard, RejectedError(f"update '{u.name}' refused: {exc}"))
            if inspect.isawaitable(verdict):
                _close(verdict)
                await self._refuse(
                    shard,
                    RejectedError(f"update '{u.name}': a validator must be a plain function, not async"),
                )
            if isinstance(verdict, str) or verdict is False:
                await self._refuse(
                    shard, RejectedError(f"update '{u.name}' refused: {verdict or 'the validator said no'}")
                )
        if accepted:
            state.event(R.UpdateAccepted(update_id, u.name, data))
            await shard.durable_at(state.last_lsn)
            return None
        fut = self._update_waiter(shard, update_id)
        state.event(R.UpdateAccepted(update_id, u.name, data))
        return _update_result(u, await fut)

    def _update_waiter(self, shard: Shard, update_id: str) -> asyncio.Future[R.UpdateDone]:
        return shard.update_waiter(self.id, update_id)

    async def _await_update(self, state: RunState, u: Update[Any, Any], update_id: str) -> Any:
        """The answer to an update that rode in `state`'s start record. The run object is
        the one the start made, even if it has ended or continued as new since (its
        results are still on it)."""
        shard = self._shard
        done = _recorded_update(state, update_id)
        if done is not None:
            await shard.durable_at(state.last_lsn)
            return _update_result(u, done)
        if state.final or state.status == Status.STUCK:
            await self._refuse(
                shard,
                RejectedError(
                    f"update '{u.name}' has no answer: workflow '{self.id}' "
                    + ("is stuck" if state.status == Status.STUCK else f"ended ({state.status})")
                    + " before the update finished"
                ),
            )
        return _update_result(u, await self._update_waiter(shard, update_id))

    async def result(self) -> Out:
        """The run's result (following continue-as-new); raises its failure."""
        shard = self._shard
        while True:
            # Parked or waiting for code: loaded, so a run whose code no longer matches its
            # journal is found stuck rather than waited on for ever.
            state: Any = shard.runs.get(self.id) or await shard.load(self.id)
            if state is None:
                # Neither loaded nor parked as `load` returned: ended (or never ran). Race:
                # a frame read before the load would be stale by now (the run's timer may
                # have woken it and it ended meanwhile): waiting by it, nothing answers.
                state = await shard.finished_run(self.id)
                if state is None:
                    try:  # a run waiting its turn (runs at once, docs/coordinators.md)
                        await through_queue(self)
                    except (NotFoundError, RejectedError):  # Rejected: its slot's shard is not held here
                        await self._refuse(
                            shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id)
                        )
                    continue
            if state.status in FINISHED:
                if isinstance(state, RunState):
                    await shard.durable_at(state.last_lsn)
                return self._outcome(state)
            if state.status == _STUCK and self.engine.profile == "dev" and state.stuck_error:
                raise state.stuck_error
            if isinstance(state, RunState) and shard.runs.get(self.id) is not state:
                continue  # replaced while this call awaited (continued as new, parked again)
            ended = await shard.result_waiter(self.id)
            current = shard.runs.get(self.id)
            if ended.status in FINISHED and (current is None or current is ended):
                # Answered once the end was durable (Callers.answer_results), and no new
                # run of the ID since: the outcome is in hand. Looking again would find
                # the run gone from memory and read its frame back from the run store (a
                # round trip to the server per result, in server mode).
                return self._outcome(ended)

    def _outcome(self, state: RunState | StoredRun) -> Out:
        rec = state.outcome
        assert isinstance(rec, R.Finished)
        if rec.status == _OK:
            wf = self.workflow or self.engine.workflows.get(state.type)
            result: Out = codec.decode(
                rec.value or b"null", wf.output_type if wf else Any, "the workflow's result"
            )
            return result
        raise error_from(rec.failure or Failure(rec.status))

    async def status(self) -> RunSummary:
        return (await self.describe()).summary

    async def started(self) -> RunSummary:
        """Wait until the run exists (a debounced or batched run: once its window
        closes); its summary."""
        summary: RunSummary = await wait_started(self)
        return summary

    def stream(self, name: str, *, from_: int = 0) -> Any:
        """A reader of the run's stream `name` from offset `from_` (docs/engine.md,
        *Streams*): `async for chunk in run.stream("tokens")`; `reader.offset` is where to
        reconnect, `reader.status` how it ended."""
        from fusee.engine.stream_reads import StreamReader

        return StreamReader(lambda: self._shard, self.id, names.name(name, "stream name"), from_)

    async def describe(self) -> RunDescription:
        """The summary and the journal, as records."""
        shard = self._shard
        state = await self._loaded(shard) or await shard.finished_run(self.id)
        if state is None:
            await self._refuse(shard, NotFoundError(f"no workflow '{self.id}'", workflow_id=self.id))
        assert state is not None
        description = RunDescription(
            RunSummary(self.id, state.run_no, state.type, run_ops.shown_status(state), shard.index),
            list(state.journal),
        )
        # What it shows leaves the process: only once every record behind it is durable.
        await shard.durable_at(shard.durability.appended)
        return description

    async def cancel(self, reason: str | None = None) -> None:
        """Ask the run to stop: its code gets CancelledError at the operations it waits
        on, and its compensations run. A stuck run records the request and takes it once
        its code is fixed."""
        reason = names.text(reason, "cancel reason")
        shard = self._shard
        try:
            state = await self._running(shard)
        except NotFoundError as error:
            try:  # a run waiting its turn leaves its queue (docs/coordinators.md)
                await cancel_queued(self, reason)
            except NotFoundError:
                raise error from None
            return
        state.event(R.CancelRequested(reason, requester()))
        await shard.durable_at(state.last_lsn)

    async def terminate(self, reason: str | None = None) -> None:
        """End the run at once: nothing of its code runs after this, not even compensation."""
        reason = names.text(reason, "terminate reason")
        shard = self._shard
        state = await self._running(shard)
        state.end(
            R.Finished(
                Status.TERMINATED, failure=Failure(reason or "terminated", type="Terminated"), by=requester()
            )
        )
        await shard.durable_at(state.last_lsn)

    async def reset(self, before_step: str, *, reapply_signals: bool = True) -> int:
        """Start the ID's next run from just before step `before_step`'s first record: the
        steps from there run again (with new keys); the signals received after the cut
        are reapplied unless `reapply_signals=False`. The run in place (running or ended)
        is replaced. Returns the new run's number once its records are durable."""
        return await run_ops.reset(self._shard, self.id, before_step, reapply_signals)

    async def retry(self) -> int:
        """A failed run starts again from before the step that failed it (`reset` to it);
        the new run's number. A run that has not failed is refused."""
        return await run_ops.retry(self._shard, self.id)

    async def resume(self) -> None:
        """The step paused out of retries (`Retry(on_exhausted="pause")`) runs again with a
        fresh set of attempts. A run with no paused step is refused."""
        await run_ops.resume(self._shard, self.id)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


def _recorded_update(state: RunState, update_id: str) -> R.UpdateDone | None:
    """An update's recorded answer. A stuck run has records its replay did not reach, and
    a run waiting for its code has not been replayed at all: its answer may be among them."""
    done = state.update_results.get(update_id)
    if done is None and state.status in (Status.STUCK, Status.WAITING_FOR_CODE):
        done = next((r for r in state.journal if isinstance(r, R.UpdateDone) and r.id == update_id), None)
    return done


def _update_result(u: Update[Any, Any], rec: R.UpdateDone) -> Any:
    if rec.failure is not None:
        raise error_from(rec.failure)
    return codec.decode(rec.value or b"null", u.result, f"update '{u.name}' result")
