"""The relay: messages between shards, clients' calls to the holders of their shards, and
listings (one call per shard, merged here), each kept here while its shard has no holder.

A message for a shard nobody holds waits (the newest RELAY_FRAMES_MAX, RELAY_BYTES_MAX),
its sender resending it every second until acknowledged. A call for such a shard fails at
once (NoHolder) unless an invoker may bring a holder: then it waits up to CALL_WAIT_S and
makes its shard due. A call its worker answered MOVED, or never answered because it left,
goes to the shard's next holder as if it arrived then (docs/server.md, *Calls and
messages*). A listing's part for each shard is such a call: a holder that lets the shard
go with the part unanswered (an invoked worker's idle end) has it routed on like any
other, instead of the whole listing failing.
An answer a worker sends after it released the call's shard waits until the
records it sent for that shard are durable (docs/server.md, *Calls at a handback*).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from fusee.journal import Ack
from fusee.protocol import messages as m
from fusee.protocol.frames import FrameError
from fusee.protocol.messages import LIMIT_METHODS
from fusee_server.invoker import Reason

if TYPE_CHECKING:
    from fusee_server.leases import Lease
    from fusee_server.listener import ServerConnection

RELAY_FRAMES_MAX = 1024  # messages kept per shard while it has no holder...
RELAY_BYTES_MAX = 8 << 20  # ...and their bytes; the oldest are dropped first
CALL_WAIT_S = 60.0  # a call waits this long at the server for its shard's holder

GONE = "the worker went away before answering; retry (the shard's next holder answers)"

_ack = msgspec.msgpack.Decoder(Ack)


class Waker(Protocol):
    """What the relay asks of the invoker: a holder for a shard something waits for."""

    def make_due(
        self,
        index: int,
        reason: Reason,
        at: float | None = None,
        type: str | None = None,
        trace: str | None = None,
    ) -> None: ...

    def why_no_worker(self, index: int) -> str: ...

    def metrics(self) -> dict[str, Any]: ...


class Settler(Protocol):
    """What the relay asks of the disk (disk.py): to hear when a shard's log is durable."""

    def after_durable(self, index: int, position: int, then: Callable[[str | None], None]) -> None: ...


class Caller(Protocol):
    """Who asked a call: a client's connection, a listing (for its parts), or the HTTP
    API (http_runs.py), whose calls take this same path."""

    @property
    def closed(self) -> bool: ...

    def send(self, answer: m.Answer) -> None: ...


class Listing:
    """A listing: one `list` call per shard, each routed as any call for that shard is
    (waiting for a holder, invoking one, rerouted when its holder lets the shard go), and
    answered to the client once every part is in, merged in shard order. A listing sent
    whole to each holder would lose a shard's rows, or fail, when its holder let it go
    before answering; a part per shard follows its shard."""

    def __init__(self, client: Caller, rid: int, parts: int) -> None:
        self.client = client
        self.rid = rid
        self.parts = parts
        self.rows: list[Any] = []
        self.error: m.Answer | None = None

    @property
    def closed(self) -> bool:
        return self.client.closed

    def send(self, answer: m.Answer) -> None:
        """A part that failed (the first failure is the listing's answer)."""
        self.part(answer, [])

    def part(self, answer: m.Answer, rows: list[Any]) -> None:
        """One shard's part; the whole goes back once every part is in."""
        self.parts -= 1
        if answer.code is not None:
            self.error = self.error or answer
        self.rows.extend(rows)
        if self.parts == 0:
            if self.error is not None:
                error = self.error
                self.client.send(m.Answer(self.rid, error.value, error.code, error.message))
            else:
                ordered = sorted(self.rows, key=lambda row: row["shard"])  # stable: each shard's order kept
                self.client.send(m.Answer(self.rid, m.encode_value(ordered)))


Waiting = tuple[Caller, m.Call, float]  # who asked, the call, until when (loop time)


class Relay:
    def __init__(self, table: list[Lease], disk: Settler) -> None:
        self.table = table  # read only: who holds each shard, under which epoch
        self.disk = disk
        self.shards = len(table)
        self.messages: list[deque[m.Relay]] = [deque() for _ in table]  # while no one holds it
        self.messages_bytes = [0 for _ in table]
        # Calls waiting for a holder (invoked workers), per shard.
        self.calls_waiting: list[deque[Waiting]] = [deque() for _ in table]
        # Calls relayed to a worker, by the server's number: who asked (and its number for
        # it), the worker, the call.
        self.calls: dict[int, tuple[Caller, int, ServerConnection, m.Call]] = {}
        self.rids = itertools.count(1)
        self.invoker: Waker | None = None
        self.limits: Any = None  # the server's limits (limits.py): answers their calls
        self.answering: set[asyncio.Task[None]] = set()  # answers waiting for the database

    def waiting(self) -> int:
        """The calls (and listings' parts) waiting for a holder."""
        return sum(map(len, self.calls_waiting))

    def calls_wait(self, index: int) -> bool:
        return bool(self.calls_waiting[index])

    def granted(self, index: int) -> None:
        """`index` has a holder now: what waited for one goes to it."""
        holder = self.table[index].holder
        messages = self.messages[index]
        while holder is not None and messages:
            holder.send(messages.popleft())
        self.messages_bytes[index] = 0
        calls = self.calls_waiting[index]
        while holder is not None and calls:
            client, call, _ = calls.popleft()
            if not client.closed:
                self._route(client, call, holder)

    # -- messages between shards --------------------------------------------------------

    def relay(self, conn: ServerConnection, message: m.Relay) -> None:
        if not 0 <= message.shard < self.shards:
            conn.fail(f"a message for shard {message.shard}: the server has {self.shards}")
            return
        lease = self.table[message.shard]
        if message.ack:
            try:
                ack = _ack.decode(message.item)
            except msgspec.DecodeError as error:
                conn.fail(f"a malformed acknowledgment: {error}")
                return
            # Only to the lease the message was sent under: a newer holder renumbered its
            # outbox, and this answer would remove another of its messages.
            if lease.holder is not None and lease.epoch == ack.epoch:
                lease.holder.send(message)
            return
        if lease.holder is not None and lease.index not in lease.holder.draining:
            lease.holder.send(message)
            return
        if self.invoker is not None:
            self.invoker.make_due(lease.index, Reason.MESSAGE)
        messages = self.messages[lease.index]
        messages.append(message)
        self.messages_bytes[lease.index] += len(message.item)
        while len(messages) > RELAY_FRAMES_MAX or self.messages_bytes[lease.index] > RELAY_BYTES_MAX:
            dropped = messages.popleft()  # its sender resends it every second
            self.messages_bytes[lease.index] -= len(dropped.item)

    # -- calls from clients ---------------------------------------------------------------

    def _later(self, client: Caller, answer: Awaitable[m.Answer]) -> None:
        async def send() -> None:
            found = await answer
            if not client.closed:
                client.send(found)

        task = asyncio.get_running_loop().create_task(send())
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    def call(self, client: Caller, call: m.Call) -> None:
        if call.method == "invocations":
            # Answered here, whatever the shard and the arguments say (it names neither).
            metrics = self.invoker.metrics() if self.invoker is not None else {"endpoints": []}
            client.send(m.Answer(call.rid, m.encode_value(metrics)))
            return
        if call.method in LIMIT_METHODS and self.limits is not None:
            answer = self.limits.call(call)  # answered here: the server holds limits
            if isinstance(answer, m.Answer):
                client.send(answer)
            else:  # a definition on its way into the database
                self._later(client, answer)
            return
        if call.shard == -1 and call.method != "list":
            # Only a listing goes to every holder: any other call sent so would run once
            # on each of them (a start on every worker).
            why = f"call {call.method!r} names no shard (-1 is for 'list' only): give its workflow's shard"
            client.send(m.Answer(call.rid, code="Rejected", message=why))
            return
        if call.shard == -1:
            self._list(client, call)
            return
        if not 0 <= call.shard < self.shards:
            client.send(m.Answer(call.rid, code="Rejected", message=f"no shard {call.shard}"))
            return
        holder = self.table[call.shard].holder
        if holder is None or call.shard in holder.draining:
            if self.invoker is None:
                client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(call.shard)))
                return
            # It waits here (up to CALL_WAIT_S) and makes its shard due.
            deadline = asyncio.get_running_loop().time() + CALL_WAIT_S
            self.calls_waiting[call.shard].append((client, call, deadline))
            kind, trace = _start_of(call)
            self.invoker.make_due(call.shard, Reason.CALL, type=kind, trace=trace)
            return
        self._route(client, call, holder)

    def _reroute(self, mover: ServerConnection, client: Caller, call: m.Call, due: bool) -> None:
        """A call `mover` answered MOVED (it let the shard go before hearing of the call,
        or with the call waiting on its run): to the shard's next holder, as if it arrived
        now. While `mover` still holds the shard here (its release is on its way) it
        waits, as for a shard without holder; and it makes the shard due only if `due`
        (MOVED_WAITING: the run's own due time brings the next holder, and invoking one
        for the wait alone would repeat at every handback while the run sleeps)."""
        if client.closed:
            return
        holder = self.table[call.shard].holder
        if holder is not mover and (due or holder is not None):
            self.call(client, call)
        elif self.invoker is None:
            client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(call.shard)))
        else:
            deadline = asyncio.get_running_loop().time() + CALL_WAIT_S
            self.calls_waiting[call.shard].append((client, call, deadline))
            if due:
                kind, trace = _start_of(call)
                self.invoker.make_due(call.shard, Reason.CALL, type=kind, trace=trace)

    def _route(self, client: Caller, call: m.Call, holder: ServerConnection) -> None:
        rid = next(self.rids)
        self.calls[rid] = (client, call.rid, holder, call)
        holder.calls.add(rid)
        holder.send(m.Call(rid, call.method, call.shard, call.args))

    def _list(self, client: Caller, call: m.Call) -> None:
        free = [s.index for s in self.table if s.holder is None or s.index in s.holder.draining]
        if free and self.invoker is None:
            client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(free[0])))
            return
        # A part per shard, each a call for its shard: one nobody holds waits for the
        # holder it invokes.
        listing = Listing(client, call.rid, self.shards)
        for index in range(self.shards):
            self.call(listing, m.Call(call.rid, call.method, index, call.args))

    def answered(self, conn: ServerConnection, answer: m.Answer) -> None:
        entry = self.calls.get(answer.rid)
        if entry is None:
            return  # its client left
        origin, rid, holder, _ = entry
        if holder is not conn:
            conn.fail(f"an answer to call {answer.rid}, which went to another connection")
            return
        del self.calls[answer.rid]
        holder.calls.discard(answer.rid)
        call = entry[3]
        if answer.code in (m.MOVED, m.MOVED_WAITING) and call.shard >= 0:
            self._reroute(
                conn, origin, m.Call(rid, call.method, call.shard, call.args), answer.code == m.MOVED
            )
            return
        if isinstance(origin, Listing):
            try:
                rows = m.decode_value(answer.value) if answer.code is None else []
                if not isinstance(rows, list) or not all(
                    isinstance(row, dict) and type(row.get("shard")) is int for row in rows
                ):
                    raise FrameError("a listing is a list of maps with a shard")
            except FrameError as error:
                conn.fail(f"a malformed listing: {error}")
                answer = m.Answer(answer.rid, code="Connection", message=GONE)
                rows = []
            origin.part(answer, rows)
            return
        released = conn.released.get(call.shard)
        if released is not None:
            # The worker released the shard before it sent this answer: a close that
            # missed its deadline lets its calls whose records were sent finish as if
            # those were durable (fusee/engine/shard.py, Shard.close). The records were
            # staged here before the release, so they will be written: the answer waits
            # until they are, and says so if the write fails. (A holder's other answers
            # come after it heard their records durable: they go at once, at no cost.)
            shard = call.shard
            self.disk.after_durable(
                shard, released, lambda failed: self._settled(origin, rid, answer, shard, failed)
            )
            return
        origin.send(m.Answer(rid, answer.value, answer.code, answer.message))

    def _settled(self, client: Caller, rid: int, answer: m.Answer, shard: int, failed: str | None) -> None:
        """A held answer: the records behind it are durable, or their write `failed`."""
        if client.closed:
            return
        if failed is not None:
            why = (
                f"the server's write of shard {shard}'s records failed ({failed}): the call may "
                "or may not have taken effect; retry it (with the same ID, if it has one)"
            )
            answer = m.Answer(rid, code="Connection", message=why)
        client.send(m.Answer(rid, answer.value, answer.code, answer.message))

    def lost(self, conn: ServerConnection, held: set[int]) -> None:
        """`conn` is gone, and with it the shards it `held`: the calls relayed to it go on."""
        for rid in conn.calls:
            entry = self.calls.pop(rid, None)
            if entry is None:
                continue
            origin, rid, _, call = entry
            if call.method == "result" and self.invoker is not None:
                # A wait for a result (a run asleep) outlives its worker: it goes to the
                # shard's next holder, or waits here for one without invoking one itself.
                self._reroute(conn, origin, call, due=False)
            elif call.shard >= 0 and call.shard not in held:
                # The worker released the shard before it closed, and a worker answers
                # every call it acted on before its release (fusee/engine/remote_calls.py): this
                # one it never acted on (it came too late), so it goes to the shard's next
                # holder, as a MOVED answer would have sent it.
                # (A listing's part too: only that shard's rows are asked again.)
                self._reroute(conn, origin, call, due=True)
            else:
                origin.send(m.Answer(rid, code="Connection", message=GONE))
        conn.calls.clear()

    # -- calls that waited in vain --------------------------------------------------------

    def expire(self) -> None:
        """The calls (and listings' parts) that waited CALL_WAIT_S for a holder fail, saying why."""
        now = asyncio.get_running_loop().time()
        for index, calls in enumerate(self.calls_waiting):
            while calls and calls[0][2] <= now:
                client, call, _ = calls.popleft()
                why = f"no worker took shard {index} within {CALL_WAIT_S:g} s{self._why(index)}; retry"
                client.send(m.Answer(call.rid, code="NoHolder", message=why))

    def fail_waiting(self, index: int, before: float, why: str) -> None:
        """The calls waiting for `index` (listings' parts too) that arrived by `before` fail
        now, saying `why`: the invocation made for them failed on an endpoint that keeps
        failing (invoker.py, FAILED_ROUNDS_FOR_CALLS), so waiting out CALL_WAIT_S would
        only hide the reason. Those that came later wait for the next try."""
        message = f"no worker took shard {index}: {why}; retry once the endpoint answers"
        keep: deque[Waiting] = deque()
        for client, call, deadline in self.calls_waiting[index]:
            if deadline - CALL_WAIT_S <= before:
                client.send(m.Answer(call.rid, code="NoHolder", message=message))
            else:
                keep.append((client, call, deadline))
        self.calls_waiting[index] = keep

    def _why(self, index: int) -> str:
        return f": {self.invoker.why_no_worker(index)}" if self.invoker is not None else ""


def _start_of(call: m.Call) -> tuple[str | None, str | None]:
    """The workflow type a start names (the endpoint for its type runs it) and the
    traceparent it carries (the invocation's POST carries it on: docs/telemetry.md)."""
    if call.method not in ("start", "signal_with_start", "update_with_start"):
        return None, None
    try:
        args = m.decode_value(call.args)
    except FrameError:
        return None, None
    if not isinstance(args, dict):
        return None, None
    kind, trace = args.get("type"), args.get("traceparent")
    return (
        kind if isinstance(kind, str) else None,
        trace if isinstance(trace, str) and len(trace) <= 512 else None,
    )


def no_holder(shard: int) -> str:
    return f"no worker holds shard {shard} now; retry once one does (start a worker, or wait for a standby)"
