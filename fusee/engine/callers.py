"""Callers waiting on a shard's runs: for a run's end (a result) and for an update's
answer. Each is answered only once what it is told is durable, and a shard that stops or
closes fails every one still waiting with why it let go, so none waits on a shard that
runs nothing (docs/engine.md, *A shard's life*)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fusee import journal as R
from fusee._errors import FuseeError, RejectedError
from fusee.engine.durability import Durability
from fusee.engine.run import RunState


class Profile(Protocol):
    @property
    def profile(self) -> str | None: ...


class CallersHost(Protocol):
    """What answering callers needs of the shard: whether it let go (and why), and its
    durability (the gate answers wait on, and the set a stop fails)."""

    @property
    def engine(self) -> Profile: ...
    @property
    def closed(self) -> bool: ...
    @property
    def durability(self) -> Durability: ...
    def stopped_error(self) -> FuseeError: ...
    def when_durable(self, lsn: int, fn: Callable[[], None]) -> None: ...


class Callers:
    def __init__(self, shard: CallersHost) -> None:
        self.shard = shard
        self.results: dict[str, list[asyncio.Future[RunState]]] = {}
        self.updates: dict[tuple[str, str], list[asyncio.Future[R.UpdateDone]]] = {}

    def result_waiter(self, wid: str) -> asyncio.Future[RunState]:
        """A future the end of `wid`'s current run (or of the run it continues as) resolves.
        The caller must have seen, with no await since, that the run has not ended: a
        waiter added for a run that ended before is answered by nothing."""
        self._check_waitable()
        fut: asyncio.Future[RunState] = asyncio.get_running_loop().create_future()
        self.results.setdefault(wid, []).append(fut)
        return fut

    def update_waiter(self, wid: str, update_id: str) -> asyncio.Future[R.UpdateDone]:
        """A future the update's durable answer resolves (or its run's end refuses)."""
        self._check_waitable()
        fut: asyncio.Future[R.UpdateDone] = asyncio.get_running_loop().create_future()
        self.updates.setdefault((wid, update_id), []).append(fut)
        return fut

    def _check_waitable(self) -> None:
        # A shard that stopped or closed while the caller awaited (a read, a load) has
        # failed the waiters it had, once: one added after that would wait for ever.
        if self.shard.closed:
            raise self.shard.stopped_error()

    def fail_all(self, also: Iterable[asyncio.Future[Any]]) -> None:
        """Fail every caller still waiting on the shard (for a result, an update's answer,
        a durable position, and `also`: its loads) with why it let go: nothing would
        answer them now."""
        error = self.shard.stopped_error()
        durable_waiting = self.shard.durability.waiting
        waiting: list[asyncio.Future[Any]] = [*durable_waiting, *also]
        for results in self.results.values():
            waiting.extend(results)
        for updates in self.updates.values():
            waiting.extend(updates)
        for fut in waiting:
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # a loader nobody awaits must not be reported as unretrieved
        durable_waiting.clear()
        self.results.clear()
        self.updates.clear()

    def refuse_updates(self, run: RunState) -> None:
        """The run ended: an update it had not answered never will be."""
        for key in [k for k in self.updates if k[0] == run.wid]:
            if key[1] not in run.update_results:
                for fut in self.updates.pop(key):
                    if not fut.done():
                        fut.set_exception(RejectedError("the workflow ended before the update finished"))

    def take_results(self, run: RunState) -> list[asyncio.Future[RunState]]:
        """The callers waiting for the run's end, taken when it ends (a new run of the ID
        may get waiters of its own before this end is durable) and held where a shard
        that stops before then fails them: otherwise they would wait for a gate that
        never opens. `answer_results` answers them once the end is durable."""
        waiters = self.results.pop(run.wid, [])
        self.shard.durability.waiting.update(waiters)
        return waiters

    def answer_results(self, run: RunState, waiters: list[asyncio.Future[RunState]]) -> None:
        self.shard.durability.waiting.difference_update(waiters)
        for fut in waiters:
            if not fut.done():
                fut.set_result(run)

    def update_finished(self, run: RunState, rec: R.UpdateDone) -> None:
        key = (run.wid, rec.id)
        if key in self.updates:
            # Answered once the result is durable; until then the waiters stay registered,
            # so a shard that stops first fails them instead of leaving them waiting.
            def release() -> None:
                for fut in self.updates.pop(key, []):
                    if not fut.done():
                        fut.set_result(rec)

            self.shard.when_durable(run.last_lsn, release)

    def run_stuck(self, run: RunState) -> None:
        """Under the dev profile a caller waiting for the result learns at once."""
        for fut in self.results.get(run.wid, []) if self.shard.engine.profile == "dev" else []:
            if not fut.done():
                fut.set_result(run)
