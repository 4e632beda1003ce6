"""The workflows the model test drives: one interpreter of a small plan language, so a
generated plan decides what a run does, and every effect it has outside the engine (step
calls, completion tokens, compensations reached) lands in `LEDGER`, where the checks read
it.

A plan is a list of items, run in order:

| item | what the run does |
| --- | --- |
| `step` | a counted step |
| `fail:K` | a step whose first K attempts fail (K=3: every attempt, the run fails) |
| `thread` | a counted step on a thread (`thread=True`) |
| `ro` | a counted read-only step |
| `draw` | `ctx.uuid()` and `ctx.now()` (recorded values) |
| `gate` | an async step that waits until the model opens the valve |
| `sleep:MS` | `ctx.sleep` |
| `wait` | `ctx.wait_for(GO)`, no timeout |
| `waitt:MS` | `ctx.wait_for(GO, timeout=MS)` |
| `comp` / `compg` | register a compensation (counted / gated) |
| `await` | `ctx.await_completion`: the token goes to the ledger |
| `all` | `ctx.all` of a step and a 200 ms sleep |
| `child:POLICY` | `ctx.child` of a short plan (step, 400 ms sleep), its result awaited |
| `spawn:POLICY` | `ctx.start_child` of a plan that waits for GO, not awaited |
| `sigwf:ID` / `cancelwf:ID` | `ctx.signal_workflow` / `ctx.cancel_workflow` (refusals caught) |
| `cas` | `ctx.continue_as_new` with the rest of the plan, twice at most |

The "patched" code (docs/engine.md, *Patching*) puts each `step` item behind
`ctx.patched("pI")`: the new branch names the step `pI`, the old one `sI` as the right
code does. A run that went past item I under the right code replays `sI`; a run reaching
it under the patched code takes `pI` and records the marker.

Every run registers its query and update handlers before its first await, so a running
run always has them. The "changed code" variants name their steps differently, which a
replay of a recorded step must refuse (the run is stuck, never silently different).
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import fusee

GO = fusee.signal("go", int)
PROGRESS = fusee.query("progress", result=dict)
BUMP = fusee.update("bump", arg=int, result=int)
BUMP_STEP = fusee.update("bump_step", arg=int, result=int)
RETRY = fusee.Retry(attempts=3, initial=200, max=400)

PLAN_TYPE = "model.plan"
TIMED_TYPE = "model.timed"  # the same code with a workflow timeout of 20 s
TIMED_MS = 20_000


@dataclass
class Plan:
    items: list[str]
    gen: int = 0  # continue-as-new generation


@dataclass
class Ledger:
    """What runs did outside the engine. `epoch` counts engine openings: a step function
    made by one engine carries that engine's epoch, whenever its thread gets to run."""

    epoch: int = 0
    calls: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    values: int = 0
    tokens: list[tuple[str, str]] = field(default_factory=list)  # (workflow id, token)
    comps: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # reached compensations
    beats: dict[str, list[int]] = field(default_factory=dict)  # a step's heartbeats, by its key
    invented: list[str] = field(default_factory=list)  # progress no attempt ever heartbeated
    valve: asyncio.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, key: str, attempt: int, epoch: int) -> int:
        with self.lock:
            self.calls[(key, attempt)].append(epoch)
            self.values += 1
            return self.values

    def reset(self) -> None:
        self.epoch = 0
        self.calls.clear()
        self.values = 0
        self.tokens.clear()
        self.comps.clear()
        self.beats.clear()
        self.invented.clear()
        self.valve = None


LEDGER = Ledger()


def _counted(fail_first: int = 0) -> Any:
    epoch = LEDGER.epoch

    def fn(s: fusee.StepContext) -> int:
        value = LEDGER.call(s.key, s.attempt, epoch)
        if s.attempt <= fail_first:
            raise RuntimeError(f"attempt {s.attempt} fails (plan: first {fail_first})")
        return value

    return fn


def _beating() -> Any:
    """A step that heartbeats pages 1..3 and starts from `s.progress()`: across crashes,
    handbacks and restarts, the progress it is handed must be one it heartbeated."""
    epoch = LEDGER.epoch

    async def fn(s: fusee.StepContext) -> int:
        sent = LEDGER.beats.setdefault(s.key, [])
        got = s.progress()
        if got is not None and got not in sent:
            LEDGER.invented.append(f"step {s.key}: progress {got!r}, heartbeats sent {sent}")
        for page in range(got or 0, 3):
            sent.append(page + 1)
            s.heartbeat(page + 1)
            await asyncio.sleep(0)
        return LEDGER.call(s.key, s.attempt, epoch)

    return fn


def _gated() -> Any:
    epoch = LEDGER.epoch

    async def fn(s: fusee.StepContext) -> int:
        value = LEDGER.call(s.key, s.attempt, epoch)
        valve = LEDGER.valve
        assert valve is not None
        await valve.wait()
        return value

    return fn


def _send_token(wid: str) -> Any:
    def send(cb: fusee.Completion) -> None:
        LEDGER.tokens.append((wid, cb.token))

    return send


def signal_value(wid: str, run: int, index: int) -> int:
    """The value a `sigwf` item sends: the same on every replay, distinct per item."""
    return zlib.crc32(f"{wid}/{run}/{index}".encode())


def child_id(wid: str, run: int, index: int) -> str:
    return f"{wid}.{run}.{index}"


CHILD_PLAN = ["step", "sleep:400"]
SPAWN_PLAN = ["wait", "step"]


def validate_bump(n: int) -> Any:
    """Refuses by raising (negative), by a message (zero) or by False (13)."""
    if n < 0:
        raise ValueError("a bump must not be negative")
    if n == 0:
        return "zero is no bump"
    if n == 13:
        return False
    return None


async def interpret(ctx: fusee.Ctx, plan: Plan, prefix: str) -> int:
    wid, run = ctx.workflow_id, ctx.run_number
    at = [-1]
    total = [0]
    comps: list[str] = []
    LEDGER.comps[(wid, run)] = comps  # replays start it afresh: what this code reached

    def bump(n: int) -> int:
        if n == 99:
            raise ValueError("the handler fails on 99")
        total[0] += n
        return total[0]

    async def bump_step(n: int) -> int:
        got: int = await ctx.step("upd", _counted())
        total[0] += n
        return got

    ctx.on_query(PROGRESS, lambda _: {"at": at[0], "total": total[0]})
    ctx.on_update(BUMP, bump, validate=validate_bump)
    ctx.on_update(BUMP_STEP, bump_step)
    for i in range(len(plan.items)):
        at[0] = i
        total[0] += await _item(ctx, plan, i, prefix, comps)
    return total[0]


async def _item(ctx: fusee.Ctx, plan: Plan, i: int, prefix: str, comps: list[str]) -> int:
    """Run plan item `i`; returns what it adds to the run's total."""
    kind, _, arg = plan.items[i].partition(":")
    base = "s" if prefix == "p" else prefix  # the patched code patches steps alone
    name = f"{base}{i}"
    steps = {"step": {}, "fail": {"retry": RETRY}, "ro": {"read_only": True}, "thread": {"thread": True}}
    if kind in steps:
        fn = _counted(int(arg)) if kind == "fail" else _counted()
        if kind == "step" and prefix == "p":  # the patched code: the old branch is prefix "s"
            name = f"p{i}" if ctx.patched(f"p{i}") else f"s{i}"
        return int(await ctx.step(name, fn, **steps[kind]))
    if kind == "gate":
        return int(await ctx.step(name, _gated()))
    if kind == "beat":
        return int(await ctx.step(name, _beating()))
    if kind == "wait":
        return int(await ctx.wait_for(GO))
    if kind == "waitt":
        return int(await ctx.wait_for(GO, timeout=int(arg)) or 0)
    if kind == "all":
        got, _ = await ctx.all([ctx.step(name, _counted()), ctx.sleep(f"{name}z", 200)])
        return int(got)
    if kind == "stream":
        # Two chunks of the run's stream "log": a replay must not append them again.
        out = ctx.stream("log")
        out.append(f"{i}a")
        out.append(f"{i}b")
    elif kind == "attr":
        # Search attributes: positionless, so every code variant sets them the same way.
        ctx.set_attributes({"item": f"{ctx.workflow_id}:{ctx.run_number}:{i}", "at": i})
    elif kind == "draw":
        ctx.uuid()
        ctx.now()
    elif kind == "sleep":
        await ctx.sleep(name, int(arg))
    elif kind in ("comp", "compg"):
        ctx.compensate(f"{base}comp{i}", _gated() if kind == "compg" else _counted())
        comps.append(f"{base}comp{i}")
    elif kind == "await":
        await ctx.await_completion(name, _send_token(ctx.workflow_id))
    elif kind in ("child", "spawn", "sigwf", "cancelwf"):
        await _other_workflow(ctx, kind, arg, i)
    elif kind == "cas":
        if plan.gen < 2:
            ctx.continue_as_new(Plan(plan.items[i + 1 :], plan.gen + 1))
    else:
        raise ValueError(f"unknown plan item {plan.items[i]!r}")
    return 0


async def _other_workflow(ctx: fusee.Ctx, kind: str, arg: str, i: int) -> None:
    wid, run = ctx.workflow_id, ctx.run_number
    if kind == "child":
        await ctx.child(PLAN, child_id(wid, run, i), Plan(CHILD_PLAN), parent_close=arg)
    elif kind == "spawn":
        await ctx.start_child(PLAN, child_id(wid, run, i), Plan(SPAWN_PLAN), parent_close=arg)
    else:
        try:
            if kind == "sigwf":
                await ctx.signal_workflow(arg, GO, signal_value(wid, run, i))
            else:
                await ctx.cancel_workflow(arg, f"by {wid}")
        except fusee.NotFoundError:
            pass  # no such run: the model checks nothing of it


async def _plan(ctx: fusee.Ctx, plan: Plan) -> int:
    return await interpret(ctx, plan, "s")


async def _plan_changed(ctx: fusee.Ctx, plan: Plan) -> int:
    return await interpret(ctx, plan, "x")


async def _plan_patched(ctx: fusee.Ctx, plan: Plan) -> int:
    return await interpret(ctx, plan, "p")


PLAN = fusee.workflow(PLAN_TYPE)(_plan)
TIMED = fusee.workflow(TIMED_TYPE, timeout=TIMED_MS)(_plan)
PLAN_CHANGED = fusee.workflow(PLAN_TYPE)(_plan_changed)
TIMED_CHANGED = fusee.workflow(TIMED_TYPE, timeout=TIMED_MS)(_plan_changed)
PLAN_PATCHED = fusee.workflow(PLAN_TYPE)(_plan_patched)
TIMED_PATCHED = fusee.workflow(TIMED_TYPE, timeout=TIMED_MS)(_plan_patched)

# -- the workflows of the flow-control moves (tests/model/features.py) -------------------

TAKE_TYPE = "model.take"  # what schedules, debounce and batches start: returns its input
LIMITED_TYPE = "model.limited"  # steps under the limit LIMIT
LIMIT = "lim"


@dataclass
class Inside:
    """A limit's attempts as counted inside the step functions, in this process: per engine
    (epoch), since a crashed engine's permits die with it. `allowed` is the bound the
    engine must keep: the limit's `concurrent`, or after a lowering the attempts then
    inside until they drop to it. `now` reads the engine's (virtual) clock."""

    inside: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    bound: int | None = None
    allowed: int | None = None
    per_second: float | None = None
    gen: int = 0  # definitions made: a rate is held between entries under one definition
    last: dict[int, tuple[int, int, str]] = field(
        default_factory=dict
    )  # epoch -> the last entry's (gen, ms, key)
    entries: int = 0
    broken: list[str] = field(default_factory=list)
    now: Any = None

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def defining(self, concurrent: int) -> None:
        """A definition is on its way: the engine applies it inside the call, granting at
        once, before the call returns; meanwhile either definition's bound holds, and no
        rate is checked across it."""
        self.allowed = max(self.allowed or 0, concurrent)
        self.gen = -abs(self.gen) - 1

    def define(self, concurrent: int | None, per_second: float | None, epoch: int) -> None:
        self.bound, self.per_second, self.gen = concurrent, per_second, abs(self.gen) + 1
        held = self.inside[epoch]
        self.allowed = None if concurrent is None else max(concurrent, held)

    def enter(self, key: str, epoch: int) -> None:
        self.inside[epoch] += 1
        self.entries += 1
        n, now = self.inside[epoch], self.now()
        if self.allowed is not None and n > self.allowed:
            self.broken.append(f"step {key}: {n} attempts inside at once, bound {self.allowed}")
        last = self.last.get(epoch)
        if self.per_second and last is not None and last[0] == self.gen > 0:
            gap = now - last[1]
            if gap < 1000 / self.per_second - 1:
                self.broken.append(
                    f"step {key} began {gap} ms after {last[2]} (at {now}), per_second={self.per_second}"
                )
        self.last[epoch] = (self.gen, now, key)

    def leave(self, epoch: int) -> None:
        self.inside[epoch] -= 1
        if self.bound is not None and self.gen > 0 and self.inside[epoch] <= self.bound:
            self.allowed = self.bound


INSIDE = Inside()


def _held(fail_first: bool) -> Any:
    """A limited step's function: counted in as the engine calls it (a plain function, so
    at its grant: a coroutine's body would begin a loop turn later, when a virtual clock
    set forward may have fired several grants' timers), out when its awaitable ends."""
    epoch = LEDGER.epoch

    def fn(s: fusee.StepContext) -> Any:
        value = LEDGER.call(s.key, s.attempt, epoch)
        INSIDE.enter(s.key, epoch)

        async def attempt() -> int:
            try:
                for _ in range(3):  # a few loop turns inside, so grants overlap
                    await asyncio.sleep(0)
                if fail_first and s.attempt == 1:
                    raise RuntimeError("the first attempt fails (a retry takes a permit again)")
            finally:
                INSIDE.leave(epoch)
            return value

        return attempt()

    return fn


async def _take(ctx: fusee.Ctx, value: Any) -> Any:
    ms = value.get("ms", 300) if isinstance(value, dict) else 300
    await ctx.sleep("s0", ms)
    return value


async def _limited(ctx: fusee.Ctx, job: dict[str, Any]) -> int:
    total = 0
    for i in range(job["n"]):
        total += await ctx.step(
            f"s{i}",
            _held(bool(job.get("fail")) and i == 0),
            retry=RETRY,
            limit=LIMIT,
            priority=job["priority"],
            fairness_key=job["key"],
            fairness_weight=job["weight"],
        )
    return total


TAKE = fusee.workflow(TAKE_TYPE)(_take)
LIMITED = fusee.workflow(LIMITED_TYPE)(_limited)


# The object type of the object moves (object_moves.py): a key's log of entries, and the
# `pending` field its exclusive handler writes first and clears before it returns.
async def _tally_add(ctx: fusee.ObjectCtx, entry: int) -> int:
    ctx.state.set("pending", entry)  # never committed: cleared before the handler returns
    await ctx.step("rec", _counted())  # a journal position: a crash may land mid-handler
    log = ctx.state.get("log") or []
    log.append(entry)
    ctx.state.set("log", log)
    ctx.state.clear("pending")
    return len(log)


async def _tally_peek(ctx: fusee.ObjectCtx) -> Any:
    return ctx.state.get("pending")


TALLY = fusee.object("tally", {"add": _tally_add, "peek": fusee.shared(_tally_peek)})

CODE = {
    "right": [PLAN, TIMED, TAKE, LIMITED, TALLY],
    "changed": [PLAN_CHANGED, TIMED_CHANGED, TAKE, LIMITED, TALLY],
    "patched": [PLAN_PATCHED, TIMED_PATCHED, TAKE, LIMITED, TALLY],
    "absent": [PLAN, TAKE, LIMITED, TALLY],  # model.timed has no code
}

# The step-name prefixes each code records: the patched code's steps are "p" on the new
# branch and "s" on the old one (workflows.py).
CODE_PREFIXES = {"right": {"s"}, "changed": {"x"}, "absent": {"s"}, "patched": {"s", "p"}}
