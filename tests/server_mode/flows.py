"""Workflows the server-mode tests run in worker processes. Every step appends what it
returned to a side file (FUSEE_TEST_STEPS), so a test can tell a step that ran again
from one whose recorded result was kept."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid

import fusee

go = fusee.signal("go", int)


def _note(wid: str, step: int, value: str) -> str:
    path = os.environ.get("FUSEE_TEST_STEPS")
    if path:
        with open(path, "a") as file:
            file.write(f"{wid} {step} {value}\n")
    return value


@fusee.workflow("steps")
async def steps(ctx: fusee.Ctx, n: int) -> list[str]:
    """`n` steps of about 30 ms each; each returns the process and a fresh token."""
    out = []
    for i in range(n):

        async def one(i: int = i) -> str:
            await asyncio.sleep(0.03)
            return _note(ctx.workflow_id, i, f"{os.getpid()}:{uuid.uuid4().hex[:8]}")

        out.append(await ctx.step(f"s{i}", one))
    return out


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx, children: int) -> list[list[str]]:
    """Starts `children` children (their IDs spread over the shards) and waits for each."""
    handles = [await ctx.start_child(steps, f"{ctx.workflow_id}-c{i}", 2) for i in range(children)]
    return [await handle.result() for handle in handles]


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx, count: int) -> list[int]:
    """Waits for `count` signals and returns their values in order of arrival."""
    got = []
    for _ in range(count):
        got.append(await ctx.wait_for(go, timeout="1h"))
    return got


@fusee.workflow("sender")
async def sender(ctx: fusee.Ctx, target: str) -> int:
    """Signals `target` (on whatever shard) with 1, 2 and 3 from inside a workflow."""
    for value in (1, 2, 3):
        await ctx.signal_workflow(target, go, value)
    return 3


@fusee.workflow("hog")
async def hog(ctx: fusee.Ctx, seconds: float) -> str:
    """Blocks its worker's event loop (as a long GC pause or blocking code would)."""
    await ctx.step("before", lambda: "ok")
    time.sleep(seconds)
    return await ctx.step("after", lambda: "done")


@fusee.workflow("big")
async def big(ctx: fusee.Ctx, megabytes: int) -> list[int]:
    """Three steps side by side, each recording `megabytes` MiB: their records reach the
    log in one flush, more than one frame of records holds."""
    values = await ctx.all(
        [ctx.step(f"part{i}", lambda i=i: chr(97 + i) * (megabytes << 20)) for i in range(3)]
    )
    return [len(value) for value in values]


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx, seconds: float) -> float:
    """Sleeps, then returns when (unix seconds) the step after the sleep ran."""
    await ctx.sleep("nap", f"{int(seconds * 1000)}ms")
    return float(await ctx.step("woke", time.time))


@fusee.workflow("slow_step")
async def slow_step(ctx: fusee.Ctx, seconds: float) -> str:
    """One step that takes `seconds` (longer than an invocation's budget, in a test)."""

    async def slow() -> str:
        await asyncio.sleep(seconds)
        return "done"

    return str(await ctx.step("slow", slow))


@fusee.workflow("pager")
async def pager(ctx: fusee.Ctx, x: dict) -> int:
    """One step exporting `x["pages"]` pages of `x["page_s"]` each, longer than a budget:
    each attempt notes where it began (`start N`), each page `page N`, and heartbeats
    the next page, so an attempt after a handback resumes there."""
    wid = ctx.workflow_id

    async def export(s: fusee.StepContext) -> int:
        start = s.progress() or 0
        _note(wid, 0, f"start:{start}")
        for page in range(start, x["pages"]):
            await asyncio.sleep(x["page_s"])
            _note(wid, 0, f"page:{page}")
            s.heartbeat(page + 1)
        return x["pages"]

    return await ctx.step("export", export)


@dataclasses.dataclass
class Order:
    item: str
    quantity: int


@dataclasses.dataclass
class Receipt:
    item: str
    quantity: int
    approved: bool
    notes: list[str]


review = fusee.signal("review", bool)
phase = fusee.query("phase", result=str)
note = fusee.update("note", arg=str, result=int)


@fusee.workflow("checkout")
async def checkout(ctx: fusee.Ctx, order: Order) -> Receipt:
    """Typed input and result, a query, an update with a validator and a typed signal:
    what tests/server_mode/test_api_parity.py asks of an engine and of a client alike."""
    notes: list[str] = []
    state = {"phase": "review"}

    def add(text: str) -> int:
        notes.append(text)
        return len(notes)

    ctx.on_query(phase, lambda _: state["phase"])
    ctx.on_update(note, add, validate=lambda text: None if text else "a note is not empty")
    approved = await ctx.wait_for(review, timeout="1h")
    state["phase"] = "shipping"
    await ctx.step("ship", lambda: f"{order.quantity} x {order.item}")
    return Receipt(order.item, order.quantity, bool(approved), notes)


received = fusee.query("received", result=int)


@fusee.workflow("collector")
async def collector(ctx: fusee.Ctx, _: int) -> list[int]:
    """Every `go` signal's value, in order of arrival, until one below 0 (not kept)."""
    got: list[int] = []
    ctx.on_query(received, lambda _: len(got))
    while True:
        value = await ctx.wait_for(go, timeout="1h")
        if value is None or value < 0:
            return got
        got.append(value)


@fusee.workflow("gather")
async def gather(ctx: fusee.Ctx, events: list) -> list:
    """A batch's (or a debounced start's) input, as it came."""
    return events


@fusee.workflow("one_at_a_time", concurrency=fusee.Concurrency(1))
async def one_at_a_time(ctx: fusee.Ctx, seconds: float) -> float:
    await ctx.sleep("work", int(seconds * 1000))
    return ctx.now().timestamp()


@fusee.workflow("limited")
async def limited(ctx: fusee.Ctx, x: dict) -> str:
    """One step under limit `x["limit"]` that takes `x["ms"]`; each attempt appends
    "+1 TIME" as it begins and "-1 TIME" as it ends to `x["file"]` (read by the test, from
    outside every worker process)."""

    async def call() -> str:
        with open(x["file"], "a") as file:
            file.write(f"+1 {time.time()} {os.getpid()}\n")
        try:
            await asyncio.sleep(x["ms"] / 1000)
        finally:
            with open(x["file"], "a") as file:
                file.write(f"-1 {time.time()} {os.getpid()}\n")
        return "ok"

    return await ctx.step(
        "call", call, limit=x["limit"], priority=x.get("priority", 0), fairness_key=x.get("key")
    )


def _charge() -> str:
    """Fails until the test writes FUSEE_TEST_STEPS + ".fixed" (the fix deployed)."""
    path = os.environ.get("FUSEE_TEST_STEPS")
    if not path or not os.path.exists(path + ".fixed"):
        raise ConnectionError("payments are down")
    return "charged"


@fusee.workflow("flaky")
async def flaky(ctx: fusee.Ctx, pause: bool) -> str:
    """A step that fails until fixed: its retries run out in ~30 ms, then it pauses the
    run (`pause`) or fails it (docs/run-operations.md)."""
    await ctx.step("prepare", lambda: "ready")
    retry = fusee.Retry(attempts=2, initial="10ms", jitter=False, on_exhausted="pause" if pause else "fail")
    return await ctx.step("charge", _charge, retry=retry)


@fusee.workflow("awaiting")
async def awaiting(ctx: fusee.Ctx, _: int) -> object:
    """Waits for a completion from outside (a callback); its send function writes the
    token to FUSEE_TEST_STEPS + ".<workflow ID>.token" and its URL (`cb.url`, when one is
    known) to ".url", for the test to complete it."""

    def send(cb: fusee.Completion) -> None:
        path = os.environ.get("FUSEE_TEST_STEPS")
        if path:
            if cb.url is not None:
                with open(f"{path}.{ctx.workflow_id}.url", "w") as file:
                    file.write(cb.url)
            with open(f"{path}.{ctx.workflow_id}.token", "w") as file:  # last: the test waits for it
                file.write(cb.token)

    return await ctx.await_completion("reply", send)


@fusee.workflow("tenant")
async def tenant(ctx: fusee.Ctx, x: dict) -> int:
    """`x["n"]` steps at once, each under limit `x["limit"]` with fairness key `x["key"]`
    (weight `x.get("weight", 1)`); each appends "KEY PID" to `x["file"]` as its attempt
    begins and, given `x["hold"]`, keeps its permit until that file exists."""

    async def call() -> int:
        with open(x["file"], "a") as file:
            file.write(f"{x['key']} {os.getpid()}\n")
        while x.get("hold") and not os.path.exists(x["hold"]):
            await asyncio.sleep(0.02)
        return 1

    done = await ctx.all(
        [
            ctx.step(
                f"s{i}", call, limit=x["limit"], fairness_key=x["key"], fairness_weight=x.get("weight", 1)
            )
            for i in range(x["n"])
        ]
    )
    return sum(done)


whisper = fusee.signal("whisper", str)
confide = fusee.update("confide", arg=str, result=str)


@fusee.workflow("secret_child")
async def secret_child(ctx: fusee.Ctx, text: str) -> str:
    return str(await ctx.step("echo", lambda: text + "-child-step"))


@fusee.workflow("secret")
async def secret(ctx: fusee.Ctx, text: str) -> dict:
    """Every kind of payload, each holding `text` (a marker the encryption tests look for
    in the data directory and on the wire): input, a step's result, heartbeat progress,
    a child's input and result, a signal, an update's argument and result, the result."""
    confided: list[str] = []

    def keep(arg: str) -> str:
        confided.append(arg)
        return arg + "-update-result"

    ctx.on_update(confide, keep)

    async def beating(s: fusee.StepContext) -> str:
        s.heartbeat(text + "-progress")
        await asyncio.sleep(0.05)
        return text + "-step"

    stepped = await ctx.step("beat", beating)
    child = await ctx.child(secret_child, f"{ctx.workflow_id}/child", text + "-child-input")
    heard = await ctx.wait_for(whisper)
    return {"step": stepped, "child": child, "signal": heard, "updates": confided}


@fusee.workflow("tagged")
async def tagged(ctx: fusee.Ctx, attrs: dict) -> int:
    """Sets `attrs` as its search attributes, then waits for `go` (list(where=) tests)."""
    ctx.set_attributes(attrs)
    return int(await ctx.wait_for(go))


@fusee.workflow("streamer")
async def streamer(ctx: fusee.Ctx, n: int) -> int:
    """Appends 0..n-1 to stream "numbers", a durable 20 ms sleep after every tenth: a
    worker killed meanwhile leaves the rest to the next holder, whose replay appends
    nothing again."""
    out = ctx.stream("numbers")
    for i in range(n):
        out.append(i)
        if i % 10 == 9:
            await ctx.sleep(f"z{i}", 20)
    out.close()
    return n


@fusee.workflow("ticker")
async def ticker(ctx: fusee.Ctx, x: dict) -> int:
    """One step appending its clock (`time.time()`) to stream "ticks" every
    `x["every_s"]`, `x["n"]` times: a reader's lateness is its own clock less the chunk
    (bench/stream_latency.py)."""

    async def tick(s: fusee.StepContext) -> int:
        out = s.stream("ticks")
        for _ in range(x["n"] - out.recorded_count):
            out.append(time.time())
            await asyncio.sleep(x["every_s"])
        return x["n"]

    return int(await ctx.step("tick", tick))


@fusee.workflow("scribe")
async def scribe(ctx: fusee.Ctx, x: dict) -> int:
    """One step writing 0..n-1 to stream "numbers" (a model's tokens, say), pausing
    `x["pause_s"]` every 50: longer than a budget, so the step runs again in the next
    invocation and continues after what it recorded."""
    n = x["n"]

    async def write(s: fusee.StepContext) -> int:
        out = s.stream("numbers")
        for i in range(out.recorded_count, n):
            out.append(i)
            if i % 50 == 49:
                await asyncio.sleep(x["pause_s"])
        return n

    return int(await ctx.step("write", write))


ledger = fusee.object("ledger")


@ledger.exclusive
async def append(ctx: fusee.ObjectCtx, entry: str) -> int:
    """Appends `entry` to the key's log; its position (1-based) is the result. The
    `pending` field is written first and cleared before the handler returns: a shared
    call that ever sees it saw uncommitted state."""
    ctx.state.set("pending", entry)
    await ctx.step("stamp", lambda: _note(ctx.workflow_id, ctx.journal_size(), entry))
    log = ctx.state.get("log") or []
    log.append(entry)
    ctx.state.set("log", log)
    ctx.state.clear("pending")
    return len(log)


@ledger.shared
async def peek(ctx: fusee.ObjectCtx) -> dict:
    return {"n": len(ctx.state.get("log") or []), "pending": ctx.state.get("pending")}


@fusee.workflow("bookkeeper")
async def bookkeeper(ctx: fusee.Ctx, keys: list) -> list:
    """Calls `ledger` keys from workflow code: each call once, whatever crashes."""
    out = []
    for key in keys:
        out.append(await ctx.object("ledger", key).call("append", f"{ctx.workflow_id}:{key}"))
    return out


WORKFLOWS = [
    ledger,
    bookkeeper,
    scribe,
    ticker,
    streamer,
    tagged,
    secret,
    secret_child,
    steps,
    parent,
    waiter,
    sender,
    hog,
    big,
    sleeper,
    slow_step,
    checkout,
    collector,
    gather,
    one_at_a_time,
    limited,
    flaky,
    awaiting,
    tenant,
]
