"""A shard's runs begin and end: `start` applies the ID policy and records a new run's
`Started`; `run_finished` answers a run's callers once its end is durable and files it in
the index (or begins the next run of a continue-as-new).

`Shard` (fusee/engine/shard.py) takes these methods as a mixin, their bodies as they were
there; what they use of the shard is `StartingShard`, the type of their `self`.
"""

from __future__ import annotations

from typing import Any, Protocol

from fusee import journal as R
from fusee._errors import AlreadyExistsError, Failure, RejectedError
from fusee.engine.callers import Callers
from fusee.engine.index import RunIndex, key_of
from fusee.engine.run import RunHost, RunSettings, RunState
from fusee.engine.timers import Timers
from fusee.journal import FINAL, IndexEntry, Status


class _Settings(RunSettings, Protocol):
    @property
    def retention_ms(self) -> int: ...


class StartingShard(RunHost, Protocol):
    """What starting and ending runs reads and changes of their shard."""

    runs: dict[str, RunState]
    index_entries: RunIndex
    callers: Callers
    types_without_code: set[str]
    closed: bool
    index: int

    @property
    def engine(self) -> _Settings: ...
    @property
    def timers(self) -> Timers: ...
    def start_ticks(self) -> None: ...
    def schedule(self, run: RunState) -> None: ...
    def put_frame(self, run: RunState) -> int: ...
    def when_durable(self, lsn: int, fn: Any) -> None: ...
    def find(self, wid: str) -> RunState | IndexEntry | None: ...
    def _begin(
        self, wid: str, run_no: int, started: R.Started, signal: tuple[str, bytes] | None = None
    ) -> RunState: ...


class RunLife:
    def find(self: StartingShard, wid: str) -> RunState | IndexEntry | None:
        return self.runs.get(wid) or self.index_entries.get(wid)

    def start(
        self: StartingShard,
        type_: str,
        wid: str,
        input: bytes,
        *,
        policy: dict[str, str] | None = None,
        timeout_ms: int | None = None,
        parent: R.Parent | None = None,
        update: tuple[str, str, bytes] | None = None,
        version: int | None = None,
        signal: tuple[str, bytes] | None = None,
        not_before: int = 0,
        traceparent: str | None = None,
    ) -> tuple[RunState | IndexEntry, bool]:
        """Record a new run (or apply the ID policy). Returns the run and whether it is new."""
        existing = self.find(wid)
        run_no = 1
        if existing is not None:
            running = existing.status not in FINAL
            rule = (policy or {}).get("running" if running else "finished", "fail" if running else "allow")
            if rule == "use-existing":
                if update is not None and existing.type != type_:
                    # An object's call (or any update-with-start) reaches only a run of the
                    # type it names: an ID held by another type's run refuses it.
                    raise RejectedError(
                        f"workflow '{wid}' is a run of '{existing.type}', not of '{type_}': "
                        "update-with-start reaches only a run of the type it names",
                        workflow_id=wid,
                    )
                return existing, False
            if running:
                if rule != "terminate-existing":
                    raise AlreadyExistsError(
                        f"workflow '{wid}' is running (run {existing.run_no}); start with "
                        "id_policy={'running': 'use-existing'} to attach to it",
                        workflow_id=wid,
                    )
                if isinstance(existing, RunState):
                    existing.end(
                        R.Finished(
                            Status.TERMINATED, failure=Failure("replaced by a new run", type="Terminated")
                        )
                    )
            elif rule == "refuse" or (rule == "allow-if-failed" and existing.status == Status.OK):
                raise AlreadyExistsError(
                    f"workflow '{wid}' already ran (run {existing.run_no}, {existing.status}) and the "
                    f"ID policy refuses another run ({rule})",
                    workflow_id=wid,
                )
            run_no = existing.run_no + 1
        wf = self.engine.workflows.get(type_)
        now = self.now_ms()
        deadline = now + timeout_ms if timeout_ms else (now + wf.timeout_ms if wf and wf.timeout_ms else 0)
        started = R.Started(
            type_,
            version or (wf.version if wf else 1),
            input,
            now,
            self.new_seed(),
            deadline,
            parent,
            *(update or (None, None, None)),
        )
        started.not_before = not_before
        started.traceparent = traceparent
        return self._begin(wid, run_no, started, signal), True

    def _begin(
        self: StartingShard,
        wid: str,
        run_no: int,
        started: R.Started,
        signal: tuple[str, bytes] | None = None,
    ) -> RunState:
        run = RunState(self, wid, run_no, started)
        self.index_entries.pop(wid)
        self.runs[wid] = run
        self.start_ticks()
        run.record(started)
        if signal is not None:
            # signal-with-start: recorded before the code first runs
            run.record(R.SignalReceived(*signal))
        run.last_active_ms = self.now_ms()
        if started.deadline:
            run.timers[-1] = started.deadline
            self.timers.add(started.deadline, run, -1)
        if run.workflow is None:
            # Another process may hold the code: the run waits, it does not fail (its
            # deadline still ends it: that needs no code).
            run.status = Status.WAITING_FOR_CODE
            self.types_without_code.add(started.type)
            return run
        for rec in run.journal:
            run.apply(rec)
        run.traced(self.index)
        self.schedule(run)
        return run

    def run_finished(self: StartingShard, run: RunState) -> None:
        """The run ended (live): answer its callers once the end is durable; a run that
        continued as new is followed by its next run in the same batch."""
        rec = run.outcome
        self.callers.refuse_updates(run)
        if isinstance(rec, R.ContinuedAsNew):
            # The deadline (a start's `timeout=` or the definition's) is the workflow ID's:
            # it bounds the whole chain of runs, as the caller of `result()` sees one.
            started = R.Started(
                run.type,
                rec.version,
                rec.input,
                rec.now,
                rec.seed,
                run.started.deadline,
                run.started.parent,
            )
            started.traceparent = run.started.traceparent  # the next run keeps the trace
            self._begin(run.wid, run.run_no + 1, started)
            return

        waiters = self.callers.take_results(run)

        def release() -> None:
            self.callers.answer_results(run, waiters)
            key = key_of(run.wid)  # hashed once for both uses (a BLAKE2 per call)
            if self.runs.get(run.wid) is run and not self.index_entries.holds_key(key):
                ref = self.put_frame(run)
                if self.closed:
                    return  # the store refused the frame: the shard stopped
                expires = self.now_ms() + self.engine.retention_ms
                self.index_entries.put_key(
                    key,
                    IndexEntry(
                        run.wid, run.run_no, run.type, run.status, ref, expires, key, *run.indexed_attrs()
                    ),
                )
                self.runs.pop(run.wid)
                self.timers.forget(run)

        self.when_durable(run.last_lsn, release)
