"""A shard's messages to and from other shards: sending them once the records that imply
them are durable, applying a received one once in effect, and taking the answers. The
outbox itself (what is unacknowledged, what was applied) is `fusee/engine/outbox.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fusee import journal as R
from fusee._errors import AlreadyExistsError, Failure, FuseeError, NotFoundError, failure_from
from fusee.engine.outbox import Outbox
from fusee.engine.run import RunState
from fusee.journal import Ack, IndexEntry, Msg, Status
from fusee.storage.contract import ShardStore
from fusee.workflow.ops import ChildOp


class Router(Protocol):
    """The engine's routing: a message to its target's shard, an answer to its sender's."""

    def route(self, msg: Msg) -> None: ...
    def route_ack(self, src: int, ack: Ack) -> None: ...


class DeliveryHost(Protocol):
    """What delivery needs of its shard: its outbox, log and durability gate, its runs
    (loaded, or started by a message), and the engine's routing."""

    @property
    def engine(self) -> Router: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def closed(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def appended(self) -> int: ...
    def now_ms(self) -> int: ...
    def start_ticks(self) -> None: ...
    def append_shard(self, rec: R.Rec) -> int: ...
    def when_durable(self, lsn: int, fn: Callable[[], None]) -> None: ...
    async def durable_at(self, lsn: int) -> None: ...
    async def load(self, wid: str) -> RunState | None: ...
    def start(
        self,
        type_: str,
        wid: str,
        input: bytes,
        *,
        timeout_ms: int | None = ...,
        parent: R.Parent | None = ...,
        traceparent: str | None = ...,
    ) -> tuple[RunState | IndexEntry, bool]: ...


class Delivery:
    """The shard's messages to and from other shards: sent once the record behind them is
    durable, applied once in effect, answered under the sender's lease."""

    def __init__(self, shard: DeliveryHost) -> None:
        self.shard = shard
        self.outbox: Outbox = shard.outbox

    def send_when_durable(self, lsn: int, msgs: list[Msg]) -> None:
        def send() -> None:
            for msg in msgs:
                self.deliver(msg)

        self.shard.when_durable(lsn, send)

    def deliver(self, msg: Msg) -> None:
        pending = self.outbox.pending.get(msg.seq)
        if pending is None:
            return
        pending.sent_at = self.shard.now_ms()
        if not pending.first_sent:
            pending.first_sent = pending.sent_at
        msg.epoch = self.shard.store.epoch
        msg.low = self.outbox.lowest_pending()
        self.shard.start_ticks()  # resends
        self.shard.engine.route(msg)

    async def receive(self, msg: Msg) -> None:
        """Apply a message from another shard (or this one), once in effect: a resend, or
        a duplicate that arrived while this one loaded its run, gets the recorded answer.
        A task of its own: if the shard stops or closes meanwhile, the message is simply
        not answered (its sender sends it again to the shard's next holder)."""
        try:
            await self._receive(msg)
        except FuseeError:
            if not self.shard.closed:
                raise

    async def _receive(self, msg: Msg) -> None:
        if self.shard.draining:
            return  # not acknowledged: the sender sends it again to the next holder
        key = (msg.src, msg.seq)
        self.outbox.saw_low(msg.src, msg.low)
        if key not in self.outbox.received:
            # The run is loaded first; from the check after the load to the Received
            # record nothing awaits, so two copies can never both be applied.
            run = await self.shard.load(msg.target) if msg.kind != "start" else None
            if key not in self.outbox.received:
                failure = self._apply(msg, run)
                lsn = self.shard.append_shard(R.Received(msg.src, msg.seq, failure))
                await self.shard.durable_at(lsn)
                self.shard.engine.route_ack(msg.src, Ack(msg.src, msg.seq, failure, msg.epoch))
                return
        failure = self.outbox.received[key]
        await self.shard.durable_at(self.shard.appended)
        self.shard.engine.route_ack(msg.src, Ack(msg.src, msg.seq, failure, msg.epoch))

    def _apply(self, msg: Msg, run: RunState | None) -> Failure | None:
        if msg.kind == "start":
            try:
                self.shard.start(
                    msg.name or "",
                    msg.target,
                    msg.value or b"null",
                    parent=msg.parent,
                    timeout_ms=msg.timeout or None,
                    traceparent=msg.trace,
                )
            except AlreadyExistsError as error:
                return failure_from(error)
            return None
        if msg.kind == "result":
            # A run begun by a reset takes the results of the children its copy started
            # (docs/run-operations.md): they name the run that started them.
            if (
                run is not None
                and not run.final
                and (run.run_no == msg.run or run.inherited.get(msg.op) == msg.run)
            ):
                run.event(R.ChildResult(msg.op, msg.value, msg.failure))
            return None
        if run is None or run.final:
            return failure_from(NotFoundError(f"no running workflow '{msg.target}'", workflow_id=msg.target))
        if msg.kind == "signal":
            run.event(R.SignalReceived(msg.name or "", msg.value or b"null", f"workflow:{msg.src}"))
        elif msg.kind == "cancel":
            run.event(R.CancelRequested(msg.reason, f"workflow:{msg.src}"))
        elif msg.kind == "terminate":
            run.end(
                R.Finished(Status.TERMINATED, failure=Failure(msg.reason or "terminated", type="Terminated"))
            )
        return None

    async def acked(self, ack: Ack) -> None:
        """Take an answer (a task of its own, as `receive`)."""
        try:
            await self._acked(ack)
        except FuseeError:
            if not self.shard.closed:
                raise

    async def _acked(self, ack: Ack) -> None:
        if ack.epoch and ack.epoch != self.shard.store.epoch:
            # An answer to a send of this shard's previous holder: it is sent again from
            # here (the outbox was rebuilt from the log) and answered under this lease.
            return
        pending = self.outbox.answered(ack.seq)
        if pending is None:
            return  # a duplicate answer
        msg = pending.msg
        run = await self.shard.load(pending.wid) if msg.kind in ("start", "signal", "cancel") else None
        if run is not None and run.run_no == pending.run and not run.final:
            if msg.kind == "start":
                run.event(R.ChildStarted(msg.op, ack.failure))
            else:
                run.event(R.Delivered(msg.op, ack.failure))
        else:
            self.shard.append_shard(R.Acked(msg.seq))

    def prepare_end(self, run: RunState, rec: R.Finished | R.ContinuedAsNew) -> None:
        """Number the messages the end sends: the outcome to a parent (the chain's last run
        sends it), closes to children (whatever way the run ended)."""
        if isinstance(rec, R.Finished) and run.started.parent is not None:
            rec.msg = self.outbox.take_number()
        closes = []
        for child, close in _running_children(run):
            if close != "abandon":
                closes.append((child, self.outbox.take_number(), close))
        rec.closes = closes


def _running_children(run: RunState) -> list[tuple[str, str]]:
    """The children a run started that have not ended, with their close policy. A run
    without its code was never replayed, and a stuck one only up to where its code
    differs: theirs are read from the journal instead."""
    if run.workflow is not None and run.status != Status.STUCK:
        out = []
        for seq, child in run.children.items():
            op = run.ops.get(seq)
            out.append((child, op.close if isinstance(op, ChildOp) else "terminate"))
        return out
    requested: dict[int, tuple[str, str]] = {}
    started: dict[int, tuple[str, str]] = {}
    for rec in run.journal:
        if isinstance(rec, R.ChildRequested):
            requested[rec.seq] = (rec.id, rec.close)
        elif isinstance(rec, R.ChildStarted) and rec.failure is None and rec.seq in requested:
            started[rec.seq] = requested[rec.seq]
        elif isinstance(rec, R.ChildResult):
            started.pop(rec.seq, None)
    return list(started.values())
