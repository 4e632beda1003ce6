"""The model test's server-mode driver: the state machine's calls made through a
`fusee.Client` against a real `fusee server` and worker processes (server_cluster.py),
the obligations each answer leaves (the same `Obligations` as in process), and the moves
a cluster adds: a worker SIGKILLed (mid-call or between calls), a holder SIGSTOPped until
its leases move, the server SIGKILLed and restarted on its directory; on the PostgreSQL
store (`StoreCluster`), the owning server SIGKILLed or SIGSTOPped past its lease and the
database restarted.

In process, the model reads the engine's memory right before and right after a call, and
nothing runs in between. Here the workers run on while the test reads, so each call is
judged against the run's state before it (a Client's `describe`) and right after it (the
run's journal): a run only ends and run numbers only grow, and nothing but the test starts
a run of the model's IDs, so a run final before, or the same run running before and after,
is what the call met; otherwise the call's refusals are not judged, only its
acknowledgments.

A call that fails because a worker went away, a shard had no holder, its lease was lost
or its engine closed is not acknowledged (it may or may not have taken effect), as a
stopped shard's calls in the faulty mode; outside a move, such an answer breaks the
documented errors."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fusee
from fusee import journal as R
from fusee.engine.tokens import parse_token

from .calls import Calls
from .harness import Violation, answer_of
from .journal import FINAL
from .server_cluster import Ledger, ModelWorker, StoreCluster, WorkersCluster
from .server_cluster import status as _status
from .workflows import BUMP, BUMP_STEP, GO, PLAN_TYPE, PROGRESS, Plan

UNACKED = (
    fusee.ConnectionError,
    fusee.NoHolderError,
    fusee.LeaseLostError,
    fusee.ClosedError,
    fusee.IoError,
)
CALL_TIMEOUT_S = 5.0  # real time, every shard held: a call answers well within it
MOVE_TIMEOUT_S = 20.0  # during a move: a stopped holder's calls wait for its lease to move (5 s)
HEALTHY_TIMEOUT_S = 25.0  # for every shard to have a holder again after a move
RULE_TIMEOUT_S = 120.0
TRACE = bool(os.environ.get("FUSEE_MODEL_TRACE"))  # print every call as it is made

# Known defects the server mode steps around (each with its xfail regression test in
# test_server_found.py); FUSEE_MODEL_STRICT=1 steps around nothing.
SERVER_KNOWN: dict[str, str] = {}  # a defect the model steps around until its fix: its test there
SERVER_AVOID: dict[str, str] = {} if os.environ.get("FUSEE_MODEL_STRICT") else dict(SERVER_KNOWN)

State = tuple[int, str] | None
Journal = tuple[int, str, list[R.Rec]]


class WallClock:
    """What checks.py reads of `h.t`: the engine's clock (wall-clock ms here)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


# A fresh PostgreSQL database per sequence, and its cluster (restarted by a move); None:
# the server's data directory.
Store = Callable[[], tuple[Any, str]] | None


class ServerCalls(Calls):
    def __init__(self, store: Store = None) -> None:
        super().__init__("server")
        self.store = store
        self.root = Path(tempfile.mkdtemp(prefix="fusee-model-server-"))
        self.cluster: WorkersCluster | None = None
        self.client: fusee.Client
        self.ledger = Ledger(self.root / "ledger")
        self.t = WallClock()  # type: ignore[assignment]
        self.moving = False  # a move under way: a call may go unanswered
        self.after: dict[str, Journal | None] = {}  # a run's journal read right after a call
        self.verified: set[tuple[str, int]] = set()  # final runs whose result() was checked
        self.moves = 0
        self.deposed: dict[str, int] = {}  # a stopped holder's engine -> its first call after it woke
        self.calling = asyncio.Event()  # set as a call (not an oracle's read) is made

    # -- the loop, the cluster, the client -------------------------------------------------

    def log(self, line: str) -> None:
        super().log(line)
        if TRACE:
            print(f"{time.monotonic():.3f} {line}", flush=True)

    def run(self, coro: Awaitable[Any]) -> Any:
        async def bounded() -> Any:
            try:
                return await asyncio.wait_for(coro, RULE_TIMEOUT_S)
            except TimeoutError:
                raise Violation("no-hang", f"a rule did not finish within {RULE_TIMEOUT_S} s") from None

        return self.loop.run_until_complete(bounded())

    async def open(self, fault_seed: int = 0) -> None:
        if self.store is not None:
            database, url = self.store()
            self.cluster = StoreCluster(self.root, database, url)
        else:
            self.cluster = WorkersCluster(self.root)
        self.client = await fusee.Client.connect(self.cluster.address())
        self.log(
            f"# fusee server on {self.cluster.host_port}; workers {[w.pid for w in self.cluster.workers]}"
        )
        self.log(f"client = await fusee.Client.connect({self.cluster.address()!r})")
        await self.healthy()

    def close(self) -> None:
        try:
            if hasattr(self, "client"):
                self.loop.run_until_complete(self.client.close())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            if self.cluster is not None:
                self.cluster.close()
            if not os.environ.get("FUSEE_MODEL_KEEP"):
                shutil.rmtree(self.root, ignore_errors=True)

    async def _connected(self) -> bool:
        """The client, connected again after the server restarted."""
        if self.client.lost is None:
            return True
        assert self.cluster is not None
        try:
            client = await fusee.Client.connect(self.cluster.address())
        except (fusee.ConnectionError, OSError):
            return False
        await self.client.close()
        self.client = client
        return True

    async def healthy(self) -> None:
        """Every shard held (a listing answers) and every worker not stopped connected."""
        assert self.cluster is not None
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        last: object = None
        while True:
            if await self._connected():
                try:
                    await asyncio.wait_for(anext(self.client.list(), None), MOVE_TIMEOUT_S)
                    if self.cluster.all_connected():
                        return
                    last = "a worker not connected"
                except (*UNACKED, TimeoutError) as error:
                    last = error
            if time.monotonic() > deadline:
                raise Violation(
                    "progress",
                    f"the cluster did not recover within {HEALTHY_TIMEOUT_S} s ({last!r}):\n"
                    + self.cluster.outputs(),
                )
            await asyncio.sleep(0.05)

    async def retried(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """A read of the oracle (not an API call the model judges), repeated through a
        failover as a client of a failing-over cluster would."""
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while True:
            error: object = None
            if await self._connected():
                try:
                    return await asyncio.wait_for(make(), MOVE_TIMEOUT_S if self.moving else CALL_TIMEOUT_S)
                except UNACKED as lost:
                    error = lost
                except TimeoutError:
                    if not self.moving:
                        raise Violation(
                            "no-hang", f"a read did not answer within {CALL_TIMEOUT_S} s"
                        ) from None
                    error = "no answer"
            if time.monotonic() > deadline:
                raise Violation("progress", f"a read went unanswered for {HEALTHY_TIMEOUT_S} s: {error!r}")
            await asyncio.sleep(0.05)

    # -- the oracle's reads --------------------------------------------------------------

    async def state(self, wid: str) -> State:
        """The run as a Client's `status` tells it (durable)."""

        async def once() -> State:
            try:
                row = await self.client.run(wid).status()
            except fusee.NotFoundError:
                return None
            return row.run, _status(row.status)

        return await self.retried(once)  # type: ignore[no-any-return]

    async def journal(self, wid: str) -> Journal | None:
        """The run's journal as `Run.describe()` returns it in the worker (durable)."""

        async def once() -> Journal | None:
            try:
                got = await self.client.call("model.journal", self.client.shard_of(wid), id=wid)
            except fusee.NotFoundError:
                return None
            return got["run"], _status(got["status"]), [R.decode_entry(e).rec for e in got["records"]]

        return await self.retried(once)  # type: ignore[no-any-return]

    async def read_after(self, wid: str) -> Journal | None:
        """Right after an answer: what `peek` and `_find_now` tell the inherited helpers."""
        self.after[wid] = await self.journal(wid)
        return self.after[wid]

    def peek(self, wid: str) -> tuple[int, str] | None:
        got = self.after.get(wid)
        return (got[0], got[1]) if got is not None else None

    async def _find_now(self, wid: str, match: Callable[[R.Rec], bool]) -> int | None:
        held = self.after.get(wid)
        if held is not None and any(match(rec) for rec in held[2]):
            return held[0]
        return None

    @staticmethod
    def exact(before: State, after: State) -> tuple[bool, State]:
        """Whether the run's state when the call met it is known, and that state."""
        if before is None or before[1] in FINAL or before == after:
            return True, before
        return False, None

    # -- calls ---------------------------------------------------------------------------

    async def call(self, line: str, make: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
        """("ok", value), ("err", a FuseeError) or ("lost", an error that promises nothing)."""
        self.log(line)
        await self._connected()
        self.calling.set()

        async def excuse(error: BaseException) -> tuple[str, Any]:
            if not self.moving:
                raise Violation(
                    "documented-errors",
                    f"`{line}` raised {type(error).__name__}: {error} with every shard held and nothing moving",
                ) from error
            self.log(f"#   -> {type(error).__name__}: {error}  (not acknowledged)")
            return "lost", error

        timeout_s = MOVE_TIMEOUT_S if self.moving else CALL_TIMEOUT_S
        return await answer_of(self.log, line, make(), timeout_s, UNACKED, excuse)

    async def start(
        self, wid: str, plan: list[str], policy: dict[str, str], timed: bool, timeout: int | None
    ) -> None:
        before = await self.state(wid)
        type_ = self.wf_name(timed)
        extra = f", timeout={timeout}" if timeout else ""
        kind, value = await self.call(
            f"await client.start({type_!r}, {wid!r}, Plan({plan!r}), id_policy={policy!r}{extra})",
            lambda: self.client.start(type_, wid, Plan(plan), id_policy=policy, timeout=timeout),
        )
        if kind == "lost":
            return
        await self.read_after(wid)
        after = self.peek(wid)
        known, at = self.exact(before, after)
        # A run running before and something else after may have ended before the call
        # met it: a policy is judged against each state it may have met, its run number
        # the one before (the least strict).
        candidates = [at] if known else [before, *((before[0], end) for end in ("ok", "failed"))]  # type: ignore[index]
        if kind == "ok":
            self._acked_start(wid, after, f"start of '{wid}'")
            if not any(
                self._legal(lambda c=c: self._check_policy(wid, policy, c, after)) for c in candidates
            ):
                self._check_policy(wid, policy, candidates[0], after)
        elif isinstance(value, fusee.AlreadyExistsError):
            if known:
                self._refused_as_existing(wid, policy, at)
                return
            if not any(
                self._legal(lambda c=c: self._refused_as_existing(wid, policy, c)) for c in candidates
            ):
                self._refused_as_existing(wid, policy, candidates[0])
            assert before is not None
            self.o.existed.append((wid, before[0]))
        else:
            raise Violation("refusals", f"start of '{wid}' refused: {type(value).__name__}: {value}")

    def _legal(self, judge: Callable[[], None]) -> bool:
        """Whether `judge` finds no violation; the obligations it noted are taken back."""
        existed, ended = len(self.o.existed), len(self.o.ended)
        try:
            judge()
            return True
        except Violation:
            return False
        finally:
            del self.o.existed[existed:]
            del self.o.ended[ended:]

    async def signal(self, wid: str, good: bool) -> None:
        if not good and "client-untyped-signal" in SERVER_AVOID:
            return
        value: Any = self.unique() if good else f"bad-{self.unique()}"
        before = await self.state(wid)
        sid = f"sig-{value}"
        kind, result = await self.call(
            f"await client.run({wid!r}).signal(GO, {value!r}, id={sid!r})",
            lambda: self.client.run(wid).signal(GO, value, id=sid),
        )
        if good and before is not None:
            # Acknowledged or not (its answer lost), a move may send it again under its ID.
            self.o.signal_ids[sid] = (wid, before[0], fusee._codec.encode(value))
        if kind == "lost":
            return
        await self.read_after(wid)
        payload = fusee._codec.encode(value)
        if kind == "ok":
            if not good:
                raise Violation("typed-calls", f"a signal of the wrong type to '{wid}' was acknowledged")
            await self._acked_signal(wid, before, payload, f"signal {value!r} to '{wid}'")
        elif not good and isinstance(result, fusee.CodecError):
            self.o.bad_signals.append((wid, payload))
        else:
            self._refused_running(wid, self.exact(before, self.peek(wid))[1], result, f"signal to '{wid}'")

    async def repeat_signal(self, index: int) -> None:
        """A signal sent again under its ID, as a caller does after an error that left its
        fate unclear (through worker kills and server restarts): the run holds it once."""
        if not self.o.signal_ids:
            return
        sid = sorted(self.o.signal_ids)[index % len(self.o.signal_ids)]
        wid, run, payload = self.o.signal_ids[sid]
        value = fusee._codec.decode(payload)
        kind, _ = await self.call(
            f"await client.run({wid!r}).signal(GO, {value!r}, id={sid!r})  # repeated",
            lambda: self.client.run(wid).signal(GO, value, id=sid),
        )
        if kind != "ok":
            return  # refused (the run ended) or lost: nothing to count
        held = await self.read_after(wid)
        if held is None or held[0] != run:
            return  # another run now: IDs are per run
        count = sum(1 for rec in held[2] if isinstance(rec, R.SignalReceived) and rec.value == payload)
        if count != 1:
            raise Violation(
                "signal-ids", f"signal {sid} sent again is recorded {count} times in run {run} of '{wid}'"
            )

    async def query(self, wid: str) -> None:
        before = await self.state(wid)
        kind, result = await self.call(
            f"await client.run({wid!r}).query(PROGRESS)", lambda: self.client.run(wid).query(PROGRESS)
        )
        if kind != "err":
            return
        await self.read_after(wid)
        known, at = self.exact(before, self.peek(wid))
        if isinstance(result, fusee.RejectedError) and "has ended" in str(result):
            if known and at is not None and at[1] == "running":
                raise Violation("refusals", f"query refused as ended while run {at} runs")
            return
        self._refused_running(wid, at, result, f"query of '{wid}'")

    async def update(self, wid: str, mode: str) -> None:
        before = await self.state(wid)
        uid = f"u{self.unique()}"
        arg: Any = {"ok": 2, "step": 3, "boom": 99, "raise": -1, "false": 13, "str": 0, "type": "three"}[mode]
        definition, name = (BUMP_STEP, "BUMP_STEP") if mode == "step" else (BUMP, "BUMP")
        kind, result = await self.call(
            f"await client.run({wid!r}).update({name}, {arg!r}, id={uid!r})",
            lambda: self.client.run(wid).update(definition, arg, id=uid),
        )
        if kind == "lost":
            return
        await self.read_after(wid)
        await self._update_answer(wid, self.exact(before, self.peek(wid))[1], uid, mode, kind, result)

    async def repeat_update(self, index: int) -> None:
        if not self.o.updates:
            return
        uid = sorted(self.o.updates)[index % len(self.o.updates)]
        wid, run, first = self.o.updates[uid]
        before = await self.state(wid)
        if before is None or before[0] != run:
            return  # another run now: update IDs are per run
        kind, result = await self.call(
            f"await client.run({wid!r}).update(BUMP, 5, id={uid!r})  # repeated",
            lambda: self.client.run(wid).update(BUMP, 5, id=uid),
        )
        if kind == "lost":
            return
        now = self.peek(wid) if await self.read_after(wid) else None
        if now is None or now[0] != run:
            return
        if kind == "err" and isinstance(result, fusee.WorkflowError) and isinstance(first[1], tuple):
            kind, result = "ok", ("raised", type(result).__name__, str(result))
        if kind == "ok" and first != ("ok", result):
            raise Violation("acknowledged", f"update {uid} repeated gave {result!r}, first {first[1]!r}")
        if kind == "err":
            raise Violation(
                "acknowledged",
                f"update {uid} repeated on run {run} refused: {type(result).__name__}: {result}",
            )

    async def signal_with_start(self, wid: str, plan: list[str], timed: bool) -> None:
        value = self.unique()
        before = await self.state(wid)
        type_ = self.wf_name(timed)
        kind, result = await self.call(
            f"await client.signal_with_start({type_!r}, {wid!r}, Plan({plan!r}), GO, {value})",
            lambda: self.client.signal_with_start(type_, wid, Plan(plan), GO, value),
        )
        if kind == "lost":
            return
        await self.read_after(wid)
        if kind == "ok":
            self._acked_start(wid, self.peek(wid), f"signal_with_start of '{wid}'")
            await self._acked_signal(wid, before, fusee._codec.encode(value), f"signal_with_start of '{wid}'")
        else:
            at = self.exact(before, self.peek(wid))[1]
            self._refused_running(wid, at, result, f"signal_with_start of '{wid}'")

    async def update_with_start(self, wid: str, plan: list[str], twice: bool) -> None:
        before = await self.state(wid)
        uids = [f"u{self.unique()}" for _ in range(2 if twice else 1)]

        async def one(uid: str) -> tuple[str, Any]:
            return await self.call(
                f"await client.update_with_start('{PLAN_TYPE}', {wid!r}, Plan({plan!r}), BUMP, 4, update_id={uid!r})",
                lambda: self.client.update_with_start(PLAN_TYPE, wid, Plan(plan), BUMP, 4, update_id=uid),
            )

        if twice:
            self.log("# the two calls below run concurrently (asyncio.gather)")
        got = await asyncio.gather(*(one(uid) for uid in uids))
        await self.read_after(wid)
        at = self.exact(before, self.peek(wid))[1]
        for uid, (kind, result) in zip(uids, got, strict=True):
            if kind == "lost":
                continue
            if kind == "ok":
                self._acked_start(wid, self.peek(wid), f"update_with_start of '{wid}'")
                result = result[1]
            await self._update_answer(wid, at, uid, "ok", kind, result)

    async def cancel(self, wid: str, twice: bool) -> None:
        for _ in range(2 if twice else 1):
            before = await self.state(wid)
            kind, result = await self.call(
                f"await client.run({wid!r}).cancel()", lambda: self.client.run(wid).cancel()
            )
            if kind == "lost":
                return
            await self.read_after(wid)
            if kind == "ok":
                run = await self._find_now(wid, lambda rec: isinstance(rec, R.CancelRequested))
                now = self.peek(wid)
                if run is not None:
                    self.o.cancels.add((wid, run))
                elif before is not None and now is not None and now[0] == before[0]:
                    raise Violation(
                        "acknowledged", f"cancel of '{wid}' returned but no CancelRequested is recorded"
                    )
            else:
                at = self.exact(before, self.peek(wid))[1]
                self._refused_running(wid, at, result, f"cancel of '{wid}'")

    async def terminate(self, wid: str) -> None:
        before = await self.state(wid)
        kind, result = await self.call(
            f"await client.run({wid!r}).terminate()", lambda: self.client.run(wid).terminate()
        )
        if kind == "lost":
            return
        held = await self.read_after(wid)
        if kind == "ok":
            last = held[2][-1] if held and held[2] else None
            if held is None or not (isinstance(last, R.Finished) and last.status == "terminated"):
                raise Violation("acknowledged", f"terminate of '{wid}' returned; its journal ends {last!r}")
            self.o.terminates.add((wid, held[0]))
        else:
            self._refused_running(wid, self.exact(before, self.peek(wid))[1], result, f"terminate of '{wid}'")

    async def complete(self, index: int, ok: bool) -> None:
        self.ledger.read()
        tokens = self.ledger.tokens
        if not tokens:
            return
        wid, token = tokens[index % len(tokens)]
        _, run, seq, attempt, _ = parse_token(token)
        tok = f"tokens[{index % len(tokens)}]"
        if ok:
            line = f"await client.complete({tok}, 7)"
            make: Callable[[], Awaitable[Any]] = lambda: self.client.complete(token, 7)  # noqa: E731
        else:
            line = f"await client.fail({tok}, 'no')"
            make = lambda: self.client.fail(token, "no")  # noqa: E731
        current = await self.journal(wid)
        kind, result = await self.call(line, make)
        if kind == "lost":
            return
        now = await self.read_after(wid)
        if kind == "ok":
            found = await self._find_now(wid, lambda rec: isinstance(rec, R.Completed) and rec.seq == seq)
            if found != run and now is not None and now[0] == run:
                raise Violation(
                    "acknowledged", f"completion of '{wid}' position {seq} returned; not recorded"
                )
            self.o.completions.append((wid, run, seq))
            return
        if not isinstance(result, fusee.RejectedError):
            raise Violation("refusals", f"completion refused with {type(result).__name__}: {result}")
        if current is not None and now is not None and current[0] == run == now[0] and now[1] == "running":
            sent = any(
                isinstance(r, R.CompletionSent) and r.seq == seq and r.attempt == attempt for r in current[2]
            )
            closed = any(
                isinstance(r, (R.Completed, R.CancelRequested))
                for r in now[2]
                if getattr(r, "seq", seq) == seq
            )
            if sent and not closed:
                raise Violation("refusals", f"a live completion token of '{wid}' was refused: {result}")

    async def open_valve(self) -> None:
        assert self.cluster is not None
        self.log(f"open('{self.cluster.valve.next()}')  # gated steps finish")
        self.cluster.valve.open()
        await asyncio.sleep(0.05)

    async def pause(self, ms: int) -> None:
        self.log(f"await asyncio.sleep({ms / 1000})")
        await asyncio.sleep(ms / 1000)

    # -- moves ---------------------------------------------------------------------------

    def _worker_for(self, shard: int | None) -> ModelWorker | None:
        assert self.cluster is not None
        return self.cluster.holder_of(shard) if shard is not None else self.cluster.standby()

    async def kill_worker(self, shard: int | None) -> None:
        """SIGKILL the holder of `shard` (None: a standby); a new standby joins."""
        assert self.cluster is not None
        worker = self._worker_for(shard)
        if worker is None:
            return
        self.moves += 1
        self.moving = True
        try:
            self.log(f"# SIGKILL worker {worker.pid} (shards {sorted(worker.held())}); a new standby starts")
            self.cluster.kill_worker(worker)
            self.cluster.start_workers(1)
            await self.healthy()
        finally:
            self.moving = False

    async def _calling(self, op: Callable[[], Awaitable[None]]) -> asyncio.Future[None]:
        """`op` under way, once its call (after the reads before it) has been sent."""
        self.calling.clear()
        task = asyncio.ensure_future(op())
        sent = asyncio.ensure_future(self.calling.wait())
        await asyncio.wait([task, sent], return_when=asyncio.FIRST_COMPLETED)
        sent.cancel()
        return task

    async def during(self, op: Callable[[], Awaitable[None]], shard: int, delay_ms: int, target: str) -> None:
        """Run a call and, `delay_ms` after it was sent, SIGKILL the holder of its shard (a
        new standby joins), SIGTERM it (`exit`: a clean exit, then a new standby), or
        SIGKILL the server (restarted on its directory): an answer it gave holds, one it did
        not promises nothing."""
        assert self.cluster is not None
        self.moves += 1
        self.moving = True
        task = await self._calling(op)
        try:
            await asyncio.sleep(delay_ms / 1000)
            if target == "server":
                self.log(f"# after {delay_ms} ms: SIGKILL the server; restarted on its directory")
                self.cluster.restart_server()
            elif target == "exit":
                worker = self.cluster.holder_of(shard)
                if worker is not None:
                    self.log(
                        f"# after {delay_ms} ms: SIGTERM worker {worker.pid} (shards "
                        f"{sorted(worker.held())}): a clean exit; a new standby starts"
                    )
                    await asyncio.to_thread(self.cluster.exit_worker, worker)
                    self.cluster.start_workers(1)
            else:
                worker = self.cluster.holder_of(shard)
                if worker is not None:
                    self.log(
                        f"# after {delay_ms} ms: SIGKILL worker {worker.pid} (shards {sorted(worker.held())})"
                    )
                    self.cluster.kill_worker(worker)
                    self.cluster.start_workers(1)
            await task
            await self.healthy()
        finally:
            self.moving = False
            task.cancel()

    async def stop_holder(
        self,
        shard: int,
        op: Callable[[], Awaitable[None]],
        delay_ms: int,
        check: Callable[[ServerCalls], Awaitable[None]],
    ) -> None:
        """SIGSTOP the holder of `shard` until its leases moved (five seconds of silence),
        a call made meanwhile; the checks read what the new holders recorded before it
        wakes (SIGCONT), and hold it to never writing again and never running a step whose
        outcome another holder recorded."""
        assert self.cluster is not None
        worker = self.cluster.holder_of(shard)
        if worker is None:
            return
        self.moves += 1
        self.moving = True
        task = await self._calling(op)
        try:
            await asyncio.sleep(delay_ms / 1000)
            self.log(f"# after {delay_ms} ms: SIGSTOP worker {worker.pid} (shards {sorted(worker.held())})")
            worker.signal(signal.SIGSTOP)
            worker.stopped = True
            await self.healthy()
            await check(self)
            index = len(worker.lines)
            deposed, woke = worker.lifetime(), self.ledger.read()
            self.deposed[deposed] = woke
            self.log(f"# SIGCONT worker {worker.pid}")
            worker.signal(signal.SIGCONT)
            worker.stopped = False
            deadline = time.monotonic() + HEALTHY_TIMEOUT_S
            while not any(line.startswith("reconnected") for line in worker.lines[index:]):
                if time.monotonic() > deadline:
                    raise Violation("progress", f"worker {worker.pid} never reconnected:\n{worker.output()}")
                await asyncio.sleep(0.02)
            self.ledger.read()
            late = [
                f"{key} attempt {attempt}"
                for (key, attempt), made in self.ledger.calls.items()
                if any(call.lifetime == deposed and call.index >= woke for call in made)
            ]
            if late:
                # (checked with every call: `server_checks._check_steps`)
                self.log(f"# worker {worker.pid} ran step functions after it woke, deposed: {late}")
            await task
            await self.healthy()
        finally:
            self.moving = False
            task.cancel()

    async def restart_server(self) -> None:
        assert self.cluster is not None
        self.moves += 1
        self.moving = True
        try:
            self.log("# SIGKILL the server; restarted on its directory and port")
            self.cluster.restart_server()
            await self.healthy()
        finally:
            self.moving = False

    # -- the PostgreSQL store's moves ----------------------------------------------------

    async def stop_server(self) -> None:
        """SIGSTOP the owning server past its lease: the standby takes the shards over and
        the workers and the client move to it through their address list. Resumed
        (SIGCONT), the old owner must step down (exit status 3) having written nothing: its
        epochs moved on in the database, which refuses them."""
        cluster = self.cluster
        assert isinstance(cluster, StoreCluster)
        owner = cluster.owner()
        if owner is None:
            return
        self.moves += 1
        self.moving = True
        try:
            self.log(f"# SIGSTOP the owning server {owner.pid}, past its lease")
            owner.signal(signal.SIGSTOP)
            deadline = time.monotonic() + HEALTHY_TIMEOUT_S
            while cluster.owner() in (owner, None):
                if time.monotonic() > deadline:
                    raise Violation("progress", "no standby took the shards over:\n" + cluster.outputs())
                await asyncio.sleep(0.05)
            await self.healthy()
            self.log(f"# SIGCONT server {owner.pid}: it must step down")
            owner.signal(signal.SIGCONT)
            code = await asyncio.to_thread(cluster.stopped_down, owner)
            if code != 3:
                raise Violation(
                    "fencing", f"a deposed server exited with {code}, not 3 (stepped down):\n{owner.output()}"
                )
            await self.healthy()
        finally:
            self.moving = False

    async def restart_database(self) -> None:
        """SIGKILL the database's postmaster and start it again: the servers ride it out
        (their writes wait and are asked after), and nothing acknowledged is lost."""
        cluster = self.cluster
        assert isinstance(cluster, StoreCluster)
        self.moves += 1
        self.moving = True
        try:
            self.log("# SIGKILL the database's postmaster; started again")
            await asyncio.to_thread(cluster.database.kill)
            await asyncio.to_thread(cluster.database.start)
            cluster.replace_exited()
            await self.healthy()
        finally:
            self.moving = False
