"""The API calls the model's state machine makes, each logged as the Python line that
makes it, and the obligations each answer leaves (what an acknowledgment or a refusal
promised) for the checks to hold the engine to. The engine, its loop and what the checks
read of it are `harness.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import fusee
from fusee import journal as R
from fusee.engine.index import BUCKET_MS, LOAD_AHEAD_MS, load_at
from fusee.engine.tokens import parse_token

from .harness import CALL_TIMEOUT_S, IDS, STOPPED, Harness, Violation, Waiter
from .journal import live_due, read
from .known import AVOID
from .workflows import BUMP, BUMP_STEP, CODE, CODE_PREFIXES, GO, LEDGER, PLAN_TYPE, PROGRESS, TIMED_TYPE, Plan


class Calls(Harness):
    racing = False  # inside `call_at_wake`: see `met`

    def unique(self) -> int:
        return 1_000_000 + next(self.counter)

    def wf_name(self, timed: bool) -> str:
        return TIMED_TYPE if timed else PLAN_TYPE

    def code_for(self, type_: str) -> str:
        """'right', 'changed' or 'absent': the code the engine has for a type now."""
        if self.code == "absent" and type_ == TIMED_TYPE:
            return "absent"
        return self.code

    async def stuck(self, wid: str, held: tuple[int, str] | None, defect: str) -> bool:
        """Whether to step around a call to a stuck run (or one that sticks once loaded),
        or to a run without code (known defects)."""
        if held is None:
            return False
        if held[1] == "waiting_for_code" and "calls-waiting-for-code" in AVOID:
            return True
        if defect not in AVOID:
            return False
        if held[1] == "stuck":
            return True
        journal = await self.journal(wid)
        return journal is not None and bool(read(journal[2]).prefixes - CODE_PREFIXES[self.code])

    def deadline_plan(self, plan: list[str], deadline: bool) -> list[str]:
        """Known defects: a run with a deadline loses it after a child or continue-as-new."""
        if deadline and "deadline-child" in AVOID:
            plan = [item for item in plan if not item.startswith("child:")]
        if deadline and "deadline-cas" in AVOID:
            plan = [item for item in plan if item != "cas"]
        return plan

    # -- operations -------------------------------------------------------------------------

    async def start(
        self, wid: str, plan: list[str], policy: dict[str, str], timed: bool, timeout: int | None
    ) -> None:
        plan = self.deadline_plan(plan, timed or bool(timeout))
        before = self.peek(wid)
        type_ = self.wf_name(timed)
        extra = f", timeout={timeout}" if timeout else ""
        kind, value = await self.call(
            f"await t.engine.start({type_!r}, {wid!r}, Plan({plan!r}), id_policy={policy!r}{extra})",
            lambda: self.t.engine.start(type_, wid, Plan(plan), id_policy=policy, timeout=timeout),
        )
        after = self.peek(wid)
        if kind == "ok":
            self._acked_start(wid, after, f"start of '{wid}'")
            self._check_policy(wid, policy, before, after)
        elif isinstance(value, fusee.AlreadyExistsError):
            self._refused_as_existing(wid, policy, before)
        elif isinstance(value, fusee.UnknownWorkflowError):
            if self.code_for(type_) != "absent":
                raise Violation(
                    "documented-errors", f"start refused a type whose code is registered: {value}"
                )
        else:
            raise Violation("refusals", f"start of '{wid}' refused: {type(value).__name__}: {value}")

    def _acked_start(self, wid: str, after: tuple[int, str] | None, what: str) -> None:
        if after is None:
            raise Violation("acknowledged", f"{what} returned but the engine holds no run of '{wid}'")
        self.o.min_run[wid] = max(self.o.min_run.get(wid, 0), after[0])

    def _check_policy(
        self, wid: str, policy: dict[str, str], before: tuple[int, str] | None, after: tuple[int, str] | None
    ) -> None:
        assert after is not None
        if before is None:
            return
        running = before[1] not in ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")
        rule = policy.get("running" if running else "finished", "fail" if running else "allow")
        # (a run may continue as new before the answer arrives: run numbers only grow)
        if rule in ("terminate-existing", "allow", "allow-if-failed") and after[0] <= before[0]:
            raise Violation("id-policy", f"{rule} on run {before} left run {after} (expected a new run)")
        if rule in ("fail", "refuse"):
            raise Violation("id-policy", f"{rule} on run {before} acknowledged a start (run {after})")

    def _refused_as_existing(self, wid: str, policy: dict[str, str], before: tuple[int, str] | None) -> None:
        if before is None:
            raise Violation("refusals", f"start of '{wid}' refused AlreadyExists, but no run of it exists")
        self.o.existed.append((wid, before[0]))
        final = before[1] in ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")
        if final:
            self.o.ended.append((wid, before[0], "a start refused as already finished"))
        rule = policy.get("finished" if final else "running", "allow" if final else "fail")
        if rule in ("use-existing", "terminate-existing", "allow") or (
            rule == "allow-if-failed" and before[1] != "ok"
        ):
            raise Violation("id-policy", f"start of '{wid}' refused although {rule} allows it (run {before})")

    async def signal(self, wid: str, good: bool, with_id: bool = False) -> None:
        value: Any = self.unique() if good else f"bad-{self.unique()}"
        before = self.peek(wid)
        if await self.stuck(wid, before, "signal-stuck"):
            return
        sid = f"sig-{value}" if with_id else None
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).signal(GO, {value!r}, id={sid!r})",
            lambda: self.t.engine.run(wid).signal(GO, value, id=sid),
        )
        payload = fusee._codec.encode(value)
        if kind == "ok":
            if not good:
                raise Violation("typed-calls", f"a signal of the wrong type to '{wid}' was acknowledged")
            await self._acked_signal(wid, before, payload, f"signal {value!r} to '{wid}'")
            now = self.peek(wid)
            if sid is not None and now is not None:
                self.o.signal_ids[sid] = (wid, now[0], payload)
        elif not good and isinstance(result, fusee.CodecError):
            self.o.bad_signals.append((wid, payload))
        else:
            self._refused_running(wid, before, result, f"signal to '{wid}'")

    async def _acked_signal(
        self, wid: str, before: tuple[int, str] | None, payload: bytes, what: str
    ) -> None:
        found = await self._find_now(
            wid, lambda rec: isinstance(rec, R.SignalReceived) and rec.value == payload
        )
        if found is not None:
            self.o.signals.append((wid, found, payload))
        elif before is not None and self.peek(wid) is not None and self.peek(wid)[0] == before[0]:  # type: ignore[index]
            raise Violation("acknowledged", f"{what} returned but the run's journal has no SignalReceived")

    async def _find_now(self, wid: str, match: Callable[[R.Rec], bool]) -> int | None:
        """The number of the current run of `wid` if its journal holds a record that
        matches (read right after an acknowledgment, before anything else runs)."""
        held = await self.journal(wid)
        if held is not None and any(match(rec) for rec in held[2]):
            return held[0]
        return None

    def met(self, wid: str, before: tuple[int, str] | None) -> tuple[int, str] | None:
        """The run as a refused call met it: as it was before the call, or, for a call made
        while timers fire (`call_at_wake`, where the run may end before the call reaches
        it), as it is after, if it is the same run (a run that ended stays ended: one still
        running after a refusal as ended was running when refused)."""
        now = self.peek(wid)
        if self.racing and before is not None and now is not None and now[0] == before[0]:
            return now
        return before

    def _refused_running(self, wid: str, before: tuple[int, str] | None, error: Any, what: str) -> None:
        """A call refused with NotFound must be about a run that ended (or none)."""
        if isinstance(error, fusee.NotFoundError):
            before = self.met(wid, before)
            if before is not None and before[1] in ("running", "stuck", "waiting_for_code"):
                raise Violation("refusals", f"{what} refused NotFound while run {before} is not final")
            if before is not None:
                self.o.ended.append((wid, before[0], what))
            return
        now = before or self.peek(wid)
        if isinstance(error, fusee.RejectedError) and now is not None:
            if now[1] == "running" and "no handler" in str(error):
                raise Violation(
                    "handlers", f"{what} refused: {error} (the run registers its handlers before it awaits)"
                )
            return
        raise Violation("refusals", f"{what} refused with {type(error).__name__}: {error}")

    async def query(self, wid: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "-"):
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).query(PROGRESS)", lambda: self.t.engine.run(wid).query(PROGRESS)
        )
        if kind == "err":
            if isinstance(result, fusee.RejectedError) and "has ended" in str(result):
                before = self.met(wid, before)
                if before is not None and before[1] in ("running", "stuck"):
                    raise Violation("refusals", f"query refused as ended while run {before} runs")
                return
            self._refused_running(wid, before, result, f"query of '{wid}'")

    async def update(self, wid: str, mode: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "update-stuck"):
            return
        uid = f"u{self.unique()}"
        arg: Any = {"ok": 2, "step": 3, "boom": 99, "raise": -1, "false": 13, "str": 0, "type": "three"}[mode]
        definition, name = (BUMP_STEP, "BUMP_STEP") if mode == "step" else (BUMP, "BUMP")
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).update({name}, {arg!r}, id={uid!r})",
            lambda: self.t.engine.run(wid).update(definition, arg, id=uid),
        )
        await self._update_answer(wid, before, uid, mode, kind, result)

    async def _update_answer(
        self, wid: str, before: tuple[int, str] | None, uid: str, mode: str, kind: str, result: Any
    ) -> None:
        valid = mode in ("ok", "step", "boom")
        if mode == "boom" and kind == "err" and isinstance(result, fusee.WorkflowError):
            kind, result = (
                "ok",
                ("raised", type(result).__name__, str(result)),
            )  # the handler's failure, recorded
        if kind == "ok":
            if not valid:
                raise Violation("refusals", f"update {uid} ({mode}) to '{wid}' was accepted: {result!r}")
            run = await self._find_now(wid, lambda rec: isinstance(rec, R.UpdateDone) and rec.id == uid)
            if run is None:
                now = self.peek(wid)
                if before is not None and now is not None and now[0] == before[0]:
                    raise Violation("acknowledged", f"update {uid} returned but its run has no UpdateDone")
                run = before[0] if before else 0
            self.o.updates[uid] = (wid, run, ("ok", result))
            return
        error = result
        if mode == "type":
            if not isinstance(error, fusee.CodecError):
                self._refused_running(wid, before, error, f"update {uid} of the wrong type")
            self.o.refused_updates.append((wid, before[0] if before else 0, uid))
            return
        if not valid:
            if isinstance(error, fusee.RejectedError) and "refused" in str(error):
                self.o.refused_updates.append((wid, before[0] if before else 0, uid))
                return
            self._refused_running(wid, before, error, f"update {uid} ({mode})")
            return
        if isinstance(error, fusee.RejectedError) and "ended before the update finished" in str(error):
            return
        self._refused_running(wid, before, error, f"update {uid} to '{wid}'")

    async def repeat_update(self, index: int) -> None:
        if not self.o.updates:
            return
        uid = sorted(self.o.updates)[index % len(self.o.updates)]
        wid, run, first = self.o.updates[uid]
        held = self.peek(wid)
        if await self.stuck(wid, held, "update-stuck"):
            return
        if held is not None and held[1] == "waiting_for_code" and "repeat-update-without-code" in AVOID:
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).update(BUMP, 5, id={uid!r})  # repeated",
            lambda: self.t.engine.run(wid).update(BUMP, 5, id=uid),
        )
        now = self.peek(wid)
        if now is None or now[0] != run:
            return  # another run now: update IDs are per run
        if kind == "err" and isinstance(result, fusee.WorkflowError) and isinstance(first[1], tuple):
            kind, result = "ok", ("raised", type(result).__name__, str(result))
        if kind == "ok" and first != ("ok", result):
            raise Violation("acknowledged", f"update {uid} repeated gave {result!r}, first {first[1]!r}")
        if kind == "err":
            raise Violation(
                "acknowledged",
                f"update {uid} repeated on run {run} refused: {type(result).__name__}: {result}",
            )

    async def repeat_signal(self, index: int) -> None:
        """An acknowledged signal sent again under its ID (a retry whose first answer was
        lost), maybe after crashes and restarts: the run holds it once."""
        if not self.o.signal_ids:
            return
        sid = sorted(self.o.signal_ids)[index % len(self.o.signal_ids)]
        wid, run, payload = self.o.signal_ids[sid]
        held = self.peek(wid)
        if held is None or held[0] != run or await self.stuck(wid, held, "signal-stuck"):
            return  # another run now (IDs are per run), or a stuck one
        value = fusee._codec.decode(payload)
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).signal(GO, {value!r}, id={sid!r})  # repeated",
            lambda: self.t.engine.run(wid).signal(GO, value, id=sid),
        )
        if kind != "ok":
            self._refused_running(wid, held, result, f"repeated signal {sid} to '{wid}'")
            return
        journal = await self.journal(wid)
        if journal is None or journal[0] != run:
            return
        count = sum(1 for rec in journal[2] if isinstance(rec, R.SignalReceived) and rec.value == payload)
        if count != 1:
            raise Violation(
                "signal-ids", f"signal {sid} sent twice is recorded {count} times in run {run} of '{wid}'"
            )

    async def signal_with_start(self, wid: str, plan: list[str], timed: bool) -> None:
        plan = self.deadline_plan(plan, timed)
        value = self.unique()
        before = self.peek(wid)
        if await self.stuck(wid, before, "signal-stuck"):
            return
        type_ = self.wf_name(timed)
        kind, result = await self.call(
            f"await t.engine.signal_with_start({type_!r}, {wid!r}, Plan({plan!r}), GO, {value})",
            lambda: self.t.engine.signal_with_start(type_, wid, Plan(plan), GO, value),
        )
        if kind == "ok":
            self._acked_start(wid, self.peek(wid), f"signal_with_start of '{wid}'")
            await self._acked_signal(wid, before, fusee._codec.encode(value), f"signal_with_start of '{wid}'")
        elif isinstance(result, fusee.UnknownWorkflowError) and self.code_for(type_) == "absent":
            return
        else:
            self._refused_running(wid, before, result, f"signal_with_start of '{wid}'")

    async def update_with_start(self, wid: str, plan: list[str], twice: bool) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "update-stuck"):
            return
        if "update-with-start-ends" in AVOID:
            plan = ["wait", *plan]  # the run must not end before its start is durable
        uids = [f"u{self.unique()}" for _ in range(2 if twice else 1)]

        async def one(uid: str) -> tuple[str, Any]:
            return await self.call(
                f"await t.engine.update_with_start('{PLAN_TYPE}', {wid!r}, Plan({plan!r}), BUMP, 4, update_id={uid!r})",
                lambda: self.t.engine.update_with_start(PLAN_TYPE, wid, Plan(plan), BUMP, 4, update_id=uid),
            )

        if twice:
            self.log("# the two calls below run concurrently (asyncio.gather)")
        got = await asyncio.gather(*(one(uid) for uid in uids), return_exceptions=True)
        stopped = [answer for answer in got if isinstance(answer, STOPPED)]
        for answer in got:
            if isinstance(answer, BaseException) and not isinstance(answer, STOPPED):
                raise answer
        answers = [(uid, answer) for uid, answer in zip(uids, got, strict=True) if isinstance(answer, tuple)]
        for uid, (kind, result) in answers:
            if kind == "ok":
                self._acked_start(wid, self.peek(wid), f"update_with_start of '{wid}'")
                result = result[1]
            await self._update_answer(wid, before, uid, "ok", kind, result)
        if stopped:
            raise stopped[0]

    async def cancel(self, wid: str, twice: bool) -> None:
        for _ in range(2 if twice else 1):
            before = self.peek(wid)
            if await self.stuck(wid, before, "cancel-stuck"):
                return
            kind, result = await self.call(
                f"await t.engine.run({wid!r}).cancel()", lambda: self.t.engine.run(wid).cancel()
            )
            if kind == "ok":
                run = await self._find_now(wid, lambda rec: isinstance(rec, R.CancelRequested))
                if run is None:
                    raise Violation(
                        "acknowledged", f"cancel of '{wid}' returned but no CancelRequested is recorded"
                    )
                self.o.cancels.add((wid, run))
            else:
                self._refused_running(wid, before, result, f"cancel of '{wid}'")
            await self.t.settle()

    async def terminate(self, wid: str) -> None:
        before = self.peek(wid)
        if await self.stuck(wid, before, "-"):
            return
        kind, result = await self.call(
            f"await t.engine.run({wid!r}).terminate()", lambda: self.t.engine.run(wid).terminate()
        )
        if kind == "ok":
            held = await self.journal(wid)
            last = held[2][-1] if held and held[2] else None
            if held is None or not (isinstance(last, R.Finished) and last.status == "terminated"):
                raise Violation("acknowledged", f"terminate of '{wid}' returned; its journal ends {last!r}")
            self.o.terminates.add((wid, held[0]))
        else:
            self._refused_running(wid, before, result, f"terminate of '{wid}'")

    async def complete(self, index: int, ok: bool) -> None:
        if not LEDGER.tokens:
            return
        wid, token = LEDGER.tokens[index % len(LEDGER.tokens)]
        _, run, seq, attempt, _ = parse_token(token)
        tok = f"LEDGER.tokens[{index % len(LEDGER.tokens)}][1]"
        if ok:
            line = f"await t.engine.complete({tok}, 7)"
            make: Callable[[], Awaitable[Any]] = lambda: self.t.engine.complete(token, 7)  # noqa: E731
        else:
            line = f"await t.engine.fail({tok}, 'no')"
            make = lambda: self.t.engine.fail(token, "no")  # noqa: E731
        current = await self.journal(wid)
        kind, result = await self.call(line, make)
        if kind == "ok":
            found = await self._find_now(wid, lambda rec: isinstance(rec, R.Completed) and rec.seq == seq)
            now = self.peek(wid)
            if found != run and now is not None and now[0] == run:
                raise Violation(
                    "acknowledged", f"completion of '{wid}' position {seq} returned; not recorded"
                )
            self.o.completions.append((wid, run, seq))
            return
        if not isinstance(result, fusee.RejectedError):
            raise Violation("refusals", f"completion refused with {type(result).__name__}: {result}")
        if current is not None and current[0] == run and current[1] == "running":
            records = current[2]
            sent = any(
                isinstance(r, R.CompletionSent) and r.seq == seq and r.attempt == attempt for r in records
            )
            closed = any(
                isinstance(r, (R.Completed, R.CancelRequested))
                for r in records
                if getattr(r, "seq", seq) == seq
            )
            sticks = (
                bool(read(records).prefixes - CODE_PREFIXES[self.code])
                or self.code_for(current[2][0].type) == "absent"
            )  # type: ignore[attr-defined]
            if sent and not closed and not sticks:
                raise Violation("refusals", f"a live completion token of '{wid}' was refused: {result}")

    def wait_result(self, wid: str) -> None:
        """Ask for the run's result and leave the call waiting, across the steps that follow
        (timers, crashes, reopenings): the checks hold the engine to answering it."""
        engine = self.t.engine
        before = self.peek(wid)
        line = f"waiters.append(asyncio.ensure_future(t.engine.run({wid!r}).result()))"
        self.log(line)

        async def answer() -> tuple[str, Any]:
            try:
                return "ok", await engine.run(wid).result()
            except fusee.FuseeError as error:
                return "err", error

        waiter = Waiter(
            wid, before[0] if before else None, LEDGER.epoch, line, self.loop.create_task(answer())
        )
        self.waiters.append(waiter)

    async def ask_again(self) -> None:
        """After a crash or a reopening: every waiter of the engine that closed has heard
        so (ClosedError), and asks the engine open now, as a caller told so would."""
        await self.t.settle()
        for waiter in [w for w in self.waiters if w.epoch != LEDGER.epoch]:
            if not waiter.task.done():
                raise Violation("no-hang", f"`{waiter.line}`: its engine closed, and it still waits")
            kind, error = waiter.task.result()
            if kind == "err" and isinstance(error, (fusee.ClosedError, *STOPPED)):
                self.waiters.remove(waiter)
                self.log(f"#   -> ClosedError: {error}  (asked again of the engine open now)")
                self.wait_result(waiter.wid)

    async def call_at_wake(self, pick: int, kind: str, turns: int, repark: int | None) -> None:
        """A call arrives as a parked run's timer wakes it: the clock moves to the run's
        next timer `turns` loop turns after the call began, with no settling in between,
        so the call's read of the parked run and the run's wake-up by its timer (and
        what follows: the run may end at once) overlap. `repark`: `repark` turns later the
        clock moves on past `park_after`, so a run the wake-up left waiting parks again,
        perhaps while the call's read is still on its way. With no parked run due, the
        call goes to one of the IDs as the clock moves to its shard's next due time."""
        parked = await self.parked_timers()
        if not parked and self.parkable():
            # Let a loaded run whose timer is far enough off park first.
            engine = self.t.engine
            await self.advance(engine.park_after_ms + engine.tick_ms)
            parked = await self.parked_timers()
        now = self.t.now_ms()
        if parked:
            due, wid = parked[pick % len(parked)]
            if wid.split(".")[0] not in IDS:
                # A run of the flow-control moves (a schedule, a coordinator, a limited or
                # scheduled run) wakes; the call goes to a plan's run meanwhile.
                wid = IDS[pick % len(IDS)]
        else:
            wid = IDS[pick % len(IDS)]
            due = self.t.engine.shard_of(wid).next_due_ms()
        calls: dict[str, Callable[[], Awaitable[None]]] = {
            "update": lambda: self.update(wid, "step"),
            "signal": lambda: self.signal(wid, True),
            "query": lambda: self.query(wid),
        }
        if due:
            self.log(
                f"# the call below, and t.clock.set(now+{max(0, due - now)}) {turns} turns after it began:"
            )
        task: asyncio.Future[None] | None = None
        if kind == "result":
            self.wait_result(wid)
        else:
            task = asyncio.ensure_future(calls[kind]())
        for _ in range(turns):
            await asyncio.sleep(0)
        if due:
            self.t.clock.set(max(due, now))
        if repark is not None:
            for _ in range(repark):
                await asyncio.sleep(0)
            engine = self.t.engine
            self.log(
                f"# ... and t.clock.set(now+{engine.park_after_ms + engine.tick_ms}) {repark} turns later"
            )
            self.t.clock.set(self.t.now_ms() + engine.park_after_ms + engine.tick_ms)
        if task is not None:
            self.racing = True
            try:
                await task
            finally:
                self.racing = False

    def parkable(self) -> bool:
        """A loaded run waits on a timer far enough off that it parks before it is due."""
        engine = self.t.engine
        now, soon = self.t.now_ms(), engine.park_after_ms + engine.tick_ms + BUCKET_MS + LOAD_AHEAD_MS
        return any(
            run.status == "running" and not run.final and run.next_due() > now + soon
            for shard in engine.shards
            for run in shard.runs.values()
        )

    async def parked_timers(self) -> list[tuple[int, str]]:
        """(earliest live timer, ID) of every parked run the model knows, earliest first
        (its journal read from the run store: nothing is loaded)."""
        out = []
        for wid in sorted(set(self.o.min_run) | {wid for wid, _ in self.observed}):
            entry = self.t.engine.shard_of(wid).index_entries.get(wid)
            if entry is None or entry.status != "parked" or not entry.due:
                continue
            held = await self.journal(wid)
            due = live_due(read(held[2])) if held is not None else 0
            if due:
                out.append((due, wid))
        return sorted(out)

    async def open_valve(self) -> None:
        self.log("LEDGER.valve.set()  # gated steps finish")
        valve = LEDGER.valve
        assert valve is not None
        valve.set()
        await self.quiesce()
        LEDGER.valve = asyncio.Event()
        self.log("LEDGER.valve = asyncio.Event()")

    async def advance(self, ms: int) -> None:
        self.log(f"await t.advance({ms})")
        await self.t.advance(ms)

    async def before_reopening(self) -> None:
        """Known defect (checkpoint-wakeup): a parked run whose timer's bucket has begun
        loses its wake-up across a reopening; step around it by letting that timer pass."""
        if "checkpoint-wakeup" not in AVOID:
            return
        now = self.t.now_ms()
        late = 0
        for row in [row async for row in self.t.engine.list()]:
            held = await self.journal(row.id)
            due = live_due(read(held[2])) if held is not None and held[1] == "running" else 0
            if due and load_at(due) <= now < due:  # its bucket is being loaded
                late = max(late, due)
        if late:
            await self.advance(late - now)

    async def crash(self, settle: bool) -> None:
        await self.before_reopening()
        while "zombie-step-result" in AVOID and self.finished_step_tasks():
            await asyncio.sleep(0)  # known: a result already computed is recorded by the dropped engine
        self.log(f"await t.crash(settle={settle})")
        LEDGER.epoch += 1
        with self.calm():
            await self.t.crash(settle=settle)
        await self.ask_again()

    async def restart(self, code: str, clean: bool) -> None:
        await self.before_reopening()
        if "waiting-for-code-resume" in AVOID and "absent" in (code, self.code):
            clean = False  # known: a clean reopening strands runs waiting for code
        self.code = code
        self.absent_once = self.absent_once or code == "absent"
        self.log(f"await t.restart(workflows=CODE[{code!r}], clean={clean})")
        LEDGER.epoch += 1
        if self.faulty is None:
            await self.t.restart(workflows=CODE[code], clean=clean)
            await self.ask_again()
            return
        # Faulty storage: the close may meet a fault (then what it had not flushed is lost,
        # as in a crash); the reopening meets none that stops a shard.
        self.t.workflows = list(CODE[code])
        if clean:
            try:
                await asyncio.wait_for(self.t.close(), CALL_TIMEOUT_S)
            except TimeoutError:
                raise Violation(
                    "no-hang", f"the engine's close did not finish within {CALL_TIMEOUT_S} s"
                ) from None
            except STOPPED as error:
                self.log(
                    f"#   -> the close failed ({type(error).__name__}: {error}): reopened as after a crash"
                )
        else:
            await self.t.settle()
            self.t.engine.abandon()
            await self.faulty.abandon()
        self.faulty.clear_failed()  # the reopening recovers every shard
        with self.calm():
            await self.t._open()
            await self.t.settle()
        await self.ask_again()

    async def then_crash(self, op: Callable[[], Awaitable[None]], turns: int) -> None:
        """Run an operation for `turns` turns of the loop, then crash at once: what it was
        acknowledged (it returned) holds, what it was not promises nothing."""
        task = asyncio.ensure_future(op())
        for _ in range(turns):
            await asyncio.sleep(0)
        self.log(f"# after {turns} turns:")
        self.check_busy_shards()
        done = task.done()
        await self.crash(settle=False)
        if not done:
            task.cancel()
            self.log("#   (that call had not answered: cancelled)")
        try:
            await task
        except (asyncio.CancelledError, Violation):
            if done:
                raise
        except fusee.ClosedError:
            pass
        except STOPPED:
            # Faulty storage: its shard stopped before the crash. Unanswered at the crash: a
            # read it made after the crash met the closed directory (IoError), which is the
            # crash's doing, as a ClosedError would be; it was not acknowledged.
            if self.faulty is None and done:
                raise
