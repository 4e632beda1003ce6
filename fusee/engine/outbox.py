"""Messages between shards and the durable outbox that carries them.

A message is never stored on its own: it is implied by the record that sends it (a
ChildRequested, SignalSent, CancelSent, or a child's Finished), so the outbox is rebuilt
from the checkpoint and the log after it. A message leaves only once that record is
durable, is resent every second until the receiver acknowledges it, and the receiver
absorbs duplicates by remembering (in a Received record) what it answered.
"""

from __future__ import annotations

import msgspec

from fusee import journal as R
from fusee._errors import Failure
from fusee.journal import Msg

RESEND_MS = 1000
ANSWER_WAIT_MS = 3000  # how long an unanswered message keeps a shard from being idle


class Pending(msgspec.Struct):
    msg: Msg
    wid: str  # the sending run (for answers that resolve one of its operations)
    run: int
    sent_at: int = 0  # the latest send, unix ms (0: not sent yet)
    first_sent: int = 0  # the first send by this holder: an idle shard waits 3 s for its answer


class Outbox:
    """A shard's unacknowledged messages and the messages it already applied."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.pending: dict[int, Pending] = {}
        self.by_op: dict[tuple[str, int, int], int] = {}
        self.received: dict[tuple[int, int], Failure | None] = {}
        # Per sending shard, the lowest message it had unanswered (it never resends below
        # it): seen now, and as of the last checkpoint, below which Received entries go.
        self.low: dict[int, int] = {}
        self.low_at_checkpoint: dict[int, int] = {}
        self.next_msg = 1

    def take_number(self) -> int:
        number = self.next_msg
        self.next_msg += 1
        return number

    def note(self, wid: str, run: int, rec: R.Rec, parent: R.Parent | None) -> Msg | list[Msg] | None:
        """Keep the outbox in step with a record (live on append, and in recovery for the
        records after the checkpoint). Returns the messages the record sends."""
        kind = type(rec)
        if kind is R.ChildRequested:
            assert isinstance(rec, R.ChildRequested)
            msg = Msg(
                "start",
                self.shard,
                rec.msg,
                rec.id,
                name=rec.type,
                value=rec.input,
                parent=R.Parent(self.shard, wid, run, rec.seq, rec.close),
                timeout=rec.timeout,
                op=rec.seq,
                trace=rec.trace,
            )
            return self._add(msg, wid, run)
        if kind is R.SignalSent:
            assert isinstance(rec, R.SignalSent)
            msg = Msg("signal", self.shard, rec.msg, rec.target, name=rec.name, value=rec.value, op=rec.seq)
            return self._add(msg, wid, run)
        if kind is R.CancelSent:
            assert isinstance(rec, R.CancelSent)
            msg = Msg("cancel", self.shard, rec.msg, rec.target, reason=rec.reason, op=rec.seq)
            return self._add(msg, wid, run)
        if kind is R.ChildStarted or kind is R.Delivered:
            assert isinstance(rec, (R.ChildStarted, R.Delivered))
            number = self.by_op.pop((wid, run, rec.seq), None)
            if number is not None:
                self.pending.pop(number, None)
            return None
        if kind is R.Finished or kind is R.ContinuedAsNew:
            assert isinstance(rec, (R.Finished, R.ContinuedAsNew))
            out: list[Msg] = []
            if isinstance(rec, R.Finished) and rec.msg and parent is not None:
                out.append(
                    self._add(
                        Msg(
                            "result",
                            self.shard,
                            rec.msg,
                            parent.wid,
                            run=parent.run,
                            value=rec.value,
                            failure=rec.failure,
                            op=parent.seq,
                        ),
                        wid,
                        run,
                    )
                )
            for child, number, close in rec.closes:
                kind_name = "terminate" if close == "terminate" else "cancel"
                out.append(
                    self._add(Msg(kind_name, self.shard, number, child, reason="parent closed"), wid, run)
                )
            return out
        if kind is R.Acked:
            assert isinstance(rec, R.Acked)
            self.pending.pop(rec.msg, None)
            return None
        if kind is R.Received:
            assert isinstance(rec, R.Received)
            self.received[(rec.src, rec.msg)] = rec.failure
            return None
        return None

    def _add(self, msg: Msg, wid: str, run: int) -> Msg:
        self.pending[msg.seq] = Pending(msg, wid, run)
        if msg.op >= 0 and msg.kind in ("start", "signal", "cancel"):
            self.by_op[(wid, run, msg.op)] = msg.seq
        if msg.seq >= self.next_msg:
            self.next_msg = msg.seq + 1
        return msg

    def lowest_pending(self) -> int:
        return min(self.pending, default=self.next_msg)

    def saw_low(self, src: int, low: int) -> None:
        if low > self.low.get(src, 0):
            self.low[src] = low

    def prune_received(self) -> int:
        """Forget the answers to messages their senders can no longer send again: those
        below the sender's low mark as of the previous checkpoint (a checkpoint interval
        later, no copy of such a message is still on its way). Called at each checkpoint;
        returns how many were forgotten. Without it the set grows with every message."""
        below = self.low_at_checkpoint
        self.low_at_checkpoint = dict(self.low)
        if not below:
            return 0
        stale = [key for key in self.received if key[1] < below.get(key[0], 0)]
        for key in stale:
            del self.received[key]
        return len(stale)

    def answered(self, seq: int) -> Pending | None:
        pending = self.pending.pop(seq, None)
        if pending is not None and pending.msg.op >= 0:
            self.by_op.pop((pending.wid, pending.run, pending.msg.op), None)
        return pending
