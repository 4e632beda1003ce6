"""The model test's invoked-mode driver: the same calls as the server mode
(server_harness.ServerCalls, made through a `fusee.Client` and judged by the same
obligations), against a `fusee server` whose only workers are the ones it invokes over
HTTP (invoke_cluster.py). Its moves: the handler's process SIGKILLed between calls or
mid-call (a fresh process on the same port, as a platform starts a new instance), a
gated step that outlives its invocation's budget (the invocation ends with the budget
and hands the shard back), and the server SIGKILLed and restarted on its directory.

What is judged differently from the server mode:

- A call that fails because its holder went away is not acknowledged, as there; outside
  a kill it is allowed only if an invocation holding its shard left meanwhile by its
  budget (or with its lease lost): the handler's trace shows it. Otherwise the answer
  breaks the documented errors.
- A call may wait for an invocation: a shard nobody holds is invoked for it, after any
  backoff the shard is in (1 s and more after a budget that ended with no step done). So
  its time limit is longer (CALL_TIMEOUT_S).
- A gated step outlives its invocation's budget until the valve opens: the invocation
  ends with the budget, hands the shard back, and the next invocation runs the step again
  (it passes at once if the valve opened meanwhile: invoke_handler_app.py). A budget that
  ends with no step done backs the shard off (1 s, doubling up to 5 min), so the harness
  opens the valve itself once two budgets ended since the last opening."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import fusee

from .harness import Violation, answer_of
from .invoke_cluster import BUDGET_MS, InvokeCluster
from .server_harness import UNACKED, ServerCalls, State

CALL_TIMEOUT_S = 20.0  # a call waits at most for an invocation after a backoff of a few seconds
MOVE_TIMEOUT_S = 30.0  # during a kill: the endpoint backs off while nothing listens on its port
HEALTHY_TIMEOUT_S = 40.0
LOG_LAG_S = 0.5  # how long a process's line may take to reach the test once written
HANDBACKS_PER_OPENING = 2  # budgets ended before the harness opens the valve itself
Journal = tuple[int, str, list[Any]]


class InvokeCalls(ServerCalls):
    def __init__(self) -> None:
        super().__init__()
        self.cluster: InvokeCluster | None = None  # type: ignore[assignment]
        self.shard: int | None = None  # the shard of the run the next call is about
        self.counts: dict[int, dict[str, Any]] = {}  # per server process: its endpoint's counts
        self.kills_checked = 0  # `kills()` when the metrics were last checked
        self.overruns = 0  # budget expiry moves (the other moves kill a process)
        self.budget_ends_opened = 0  # budget ends seen when the harness last opened the valve
        self.excused = 0  # calls not acknowledged because their invocation's budget ended
        self.quiet_checks = 0

    # -- the cluster and the client ------------------------------------------------------

    async def open(self, fault_seed: int = 0) -> None:
        self.cluster = InvokeCluster(self.root)
        self.client = await fusee.Client.connect(self.cluster.address())
        self.log(
            f"# fusee server on {self.cluster.host_port} invoking uvicorn (pid {self.cluster.handler.pid}) "
            f"on port {self.cluster.handler_port}, budget {BUDGET_MS} ms"
        )
        self.log(f"client = await fusee.Client.connect({self.cluster.address()!r})")
        await self.healthy()

    async def healthy(self) -> None:
        """The client connected (again, after a server restart) and the server answering."""
        assert self.cluster is not None
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        last: object = None
        while True:
            if await self._connected():
                try:
                    await asyncio.wait_for(self.metrics(), MOVE_TIMEOUT_S)
                    return
                except (*UNACKED, TimeoutError) as error:
                    last = error
            if time.monotonic() > deadline:
                raise Violation(
                    "progress",
                    f"the cluster did not recover within {HEALTHY_TIMEOUT_S} s ({last!r}):\n"
                    + self.cluster.outputs(),
                )
            await asyncio.sleep(0.05)

    async def recovered(self) -> None:
        """After a kill: until every shard's invocation succeeded again (a listing invokes
        each) and the endpoint is out of its backoff. Each invocation a kill ends backs
        its shard off (100 ms doubling to 30 s, reset by the shard's next report) and the
        endpoint (reset by a success), and a kill right after a check catches every shard
        in flight: kills in a row would otherwise compound to the 30 s ceiling (the
        faster for each crash doubling a shard's backoff twice: test_invoke_found.py)."""
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while True:
            failed = (await self.retried(self.metrics))["endpoints"][0]["failed"]
            await self.retried(
                lambda: anext(self.client.list(), None)
            )  # (every shard held at once: each invoked)
            now = await self.retried(self.metrics)
            while now["invokingShards"] or now["endpoints"][0]["inFlight"]:
                if time.monotonic() > deadline:
                    raise Violation("progress", f"still invoking {HEALTHY_TIMEOUT_S} s after a kill: {now}")
                await asyncio.sleep(0.02)
                now = await self.retried(self.metrics)
            if now["endpoints"][0]["failed"] == failed and not now["endpoints"][0]["backoffMs"]:
                break
            if time.monotonic() > deadline:
                raise Violation("progress", f"still backing off {HEALTHY_TIMEOUT_S} s after a kill: {now}")
        self.log("# (every shard invoked again with success: the backoffs are reset)")

    def kills(self) -> int:
        """The moves so far that killed a process (the handler or the server)."""
        return self.moves - self.overruns

    async def metrics(self) -> dict[str, Any]:
        got: dict[str, Any] = await self.client.call("invocations", {})
        return got

    async def state(self, wid: str) -> State:
        self.shard = self.client.shard_of(wid)
        return await super().state(wid)

    async def journal(self, wid: str) -> Journal | None:
        self.shard = self.client.shard_of(wid)
        return await super().journal(wid)

    # -- calls ---------------------------------------------------------------------------

    async def call(self, line: str, make: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
        """("ok", value), ("err", a FuseeError) or ("lost", an error that promises nothing:
        during a kill, or when an invocation holding the call's shard left by its budget
        or with its lease lost while the call was in flight)."""
        self.log(line)
        await self._connected()
        self.calling.set()
        shard, sent = self.shard, time.monotonic()

        async def excuse(error: BaseException) -> tuple[str, Any]:
            why = "a move under way" if self.moving else await self._left_meanwhile(shard, sent)
            if why is None:
                raise Violation(
                    "documented-errors",
                    f"`{line}` raised {type(error).__name__}: {error}; nothing was killed and no "
                    f"invocation holding shard {shard} left but idle meanwhile",
                ) from error
            self.log(f"#   -> {type(error).__name__}: {error}  (not acknowledged: {why})")
            return "lost", error

        timeout_s = MOVE_TIMEOUT_S if self.moving else CALL_TIMEOUT_S
        return await answer_of(self.log, line, make(), timeout_s, UNACKED, excuse)

    async def _left_meanwhile(self, shard: int | None, since: float) -> str | None:
        """An invocation holding `shard` left since `since` other than idle (its trace
        line may take a moment to arrive)."""
        assert self.cluster is not None
        deadline = time.monotonic() + LOG_LAG_S
        while True:
            found = self.cluster.left(shard, since)
            if found:
                self.excused += 1
                return found[0]
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)

    # -- the valve -----------------------------------------------------------------------

    def open_valve_after_handbacks(self) -> None:
        """Once HANDBACKS_PER_OPENING budgets ended since the last opening, open the valve:
        the gated steps they handed back finish in their next invocation."""
        assert self.cluster is not None
        ends = self.cluster.budget_ends()
        if ends - self.budget_ends_opened >= HANDBACKS_PER_OPENING:
            self.log(
                f"open('{self.cluster.valve.next()}')"
                f"  # {ends - self.budget_ends_opened} budgets ended: gated steps finish"
            )
            self.cluster.valve.open()
            self.budget_ends_opened = ends

    async def open_valve(self) -> None:
        assert self.cluster is not None
        self.budget_ends_opened = self.cluster.budget_ends()
        await super().open_valve()

    # -- moves ---------------------------------------------------------------------------

    async def kill_handler(self) -> None:
        """SIGKILL the handler's process (whatever it is doing); a new one on its port."""
        assert self.cluster is not None
        handler = self.cluster.handler
        self.moves += 1
        self.moving = True
        try:
            self.log(
                f"# SIGKILL the handler (pid {handler.pid}, requests in flight {handler.in_flight()}); "
                "a new one starts on its port"
            )
            self.cluster.kill_handler()
            await self.healthy()
            await self.recovered()
        finally:
            self.moving = False

    async def during(  # type: ignore[override]
        self, op: Callable[[], Awaitable[None]], delay_ms: int, target: str
    ) -> None:
        """Run a call and, `delay_ms` after it was sent, SIGKILL the handler (a new one
        starts on its port) or the server (restarted on its directory): an answer given
        holds, one not given promises nothing."""
        assert self.cluster is not None
        self.moves += 1
        self.moving = True
        task = await self._calling(op)
        try:
            await asyncio.sleep(delay_ms / 1000)
            if target == "server":
                self.log(f"# after {delay_ms} ms: SIGKILL the server; restarted on its directory")
                self.cluster.restart_server()
            else:
                handler = self.cluster.handler
                self.log(
                    f"# after {delay_ms} ms: SIGKILL the handler (pid {handler.pid}, requests in flight "
                    f"{handler.in_flight()}); a new one starts on its port"
                )
                self.cluster.kill_handler()
            await task
            await self.healthy()
            await self.recovered()
        finally:
            self.moving = False
            task.cancel()

    async def overrun(
        self, wid: str, plan: list[str], op: Callable[[], Awaitable[None]], delay_ms: int, reopen: bool
    ) -> None:
        """A budget expiry: a run of `wid` whose first step is gated (a start that
        terminates a running run) keeps its invocation busy until the budget ends; a call
        `op` goes out `delay_ms` after the gated step began. The invocation must leave by
        its budget and hand the shard back; then (`reopen`) the valve opens."""
        assert self.cluster is not None
        shard = self.client.shard_of(wid)
        since = time.monotonic()
        self.moves += 1
        self.overruns += 1
        self.log(f"# budget expiry on shard {shard}: a gated step outlives its invocation's budget")
        await self.start(
            wid, ["gate", *plan], {"running": "terminate-existing", "finished": "allow"}, False, None
        )
        started = await self.read_after(wid)  # (the start may have gone unanswered)
        if started is None or started[1] != "running":
            return
        run = started[0]
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not self._gate_began(f"{wid}/{run}/"):
            now = await self.state(wid)
            if now is None or now != (run, "running"):
                self.log(f"# run {run} of '{wid}' is {now} before its gated step began")
                return
            if time.monotonic() > deadline:
                raise Violation("progress", f"the gated step of run {run} of '{wid}' never began")
            await asyncio.sleep(0.02)
        await asyncio.sleep(delay_ms / 1000)
        task = await self._calling(op)
        try:
            await task
            await self._budget_ended(wid, run, shard, since)
            if reopen:
                await self.open_valve()
        finally:
            task.cancel()

    async def _budget_ended(self, wid: str, run: int, shard: int, since: float) -> None:
        """Until an invocation of `shard` left by its budget (since `since`), unless the
        gated run stopped running first (the call made during the move ended it)."""
        assert self.cluster is not None
        deadline = time.monotonic() + BUDGET_MS / 1000 + CALL_TIMEOUT_S
        while True:
            ended = [line for line in self.cluster.left(shard, since) if "exit=budget" in line]
            if ended:
                self.log(f"# {ended[0]}")
                return
            now = await self.state(wid)
            if now is None or now[0] != run or now[1] != "running":
                self.log(f"# run {run} of '{wid}' is {now} before its invocation's budget ended")
                return
            if time.monotonic() > deadline:
                raise Violation(
                    "budget",
                    f"no invocation of shard {shard} ended by its budget while a gated step ran:\n"
                    + self.cluster.outputs(),
                )
            await asyncio.sleep(0.05)

    def _gate_began(self, prefix: str) -> bool:
        self.ledger.read()
        return any(
            key.startswith(prefix) and any(call.kind == "gate" for call in calls)
            for (key, _), calls in self.ledger.calls.items()
        )
