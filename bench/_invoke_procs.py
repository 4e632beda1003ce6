"""What bench/invoke_cost.py runs besides itself: the workflows, the handler's ASGI app
and the two child processes (`fusee server --invoke` and uvicorn serving the handler).

The handler process imports this module twice over: as uvicorn's app (`_invoke_procs:app`,
`--app-dir bench`) and as FUSEE_WORKFLOWS. `app` is `handlers.asgi:app` (the same
`handlers.from_environment()`), wrapped only to stamp each request: the wall-clock time it
arrived and was answered, written to standard error after the answer has gone, so that
the stamp costs the invocation nothing. With FUSEE_INVOKE_TRACE=1 the handler's own trace
lines (`+X ms leased`, `opened open_ms=...`) are relative to that arrival, so the benchmark
can place them on the same clock as the client and the step (time.time() on one machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fusee

# -- the workflows ----------------------------------------------------------------------


@fusee.workflow("first")
async def first(ctx: fusee.Ctx, _: None) -> float:
    """The cold start's probe: its one step returns when (unix seconds) its body ran."""
    return float(await ctx.step("first", time.time))


@fusee.workflow("fan")
async def fan(ctx: fusee.Ctx, steps: int) -> int:
    """`steps` trivial steps, one after another."""
    total = 0
    for i in range(steps):
        total += await ctx.step(f"s{i}", lambda i=i: i)
    return total


@fusee.workflow("nap")
async def nap(ctx: fusee.Ctx, ms: int) -> list[float]:
    """Sleeps `ms`; returns the timer's recorded due time and when the step after the
    sleep ran (unix ms)."""
    timer = ctx.sleep("nap", ms)
    await timer
    woke = await ctx.step("woke", time.time)
    return [float(timer.due), woke * 1000]


@fusee.workflow("parked")
async def parked(ctx: fusee.Ctx, _: None) -> None:
    """Asleep for an hour: a run the shard's recovery has to index and nothing more."""
    await ctx.sleep("hour", "1h")


# -- the handler's app ------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class Stamped:
    """An ASGI app in front of `inner` that, after each HTTP answer has been sent, prints
    `bench invocation <id> arrived=<unix s> answered=<unix s>`."""

    def __init__(self, inner: Callable[..., Awaitable[None]]) -> None:
        self.inner = inner

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        arrived = time.time()
        chunks: list[bytes] = []

        async def body(chunks: list[bytes] = chunks) -> Message:
            message = await receive()
            chunks.append(message.get("body", b""))
            return message

        await self.inner(scope, body, send)
        answered = time.time()
        try:
            invocation = str(json.loads(b"".join(chunks))["invocation"])
        except (ValueError, KeyError, TypeError):
            invocation = "-"
        print(
            f"bench invocation {invocation} arrived={arrived:.6f} answered={answered:.6f}",
            file=sys.stderr,
            flush=True,
        )


def __getattr__(name: str) -> Any:
    """`app`, built on first use: only the handler process configures one (from its
    environment, as handlers/asgi.py does), not the benchmark importing the workflows."""
    if name != "app":
        raise AttributeError(name)
    from handlers import from_environment

    built = Stamped(from_environment())
    globals()["app"] = built
    return built


# -- what the handler printed, per invocation -------------------------------------------

_TRACE = re.compile(r"^fusee invoke (\S+) \+([\d.]+)ms (\S+)(.*)$")
_STAMP = re.compile(r"^bench invocation (\S+) arrived=([\d.]+) answered=([\d.]+)$")
_OPEN_MS = re.compile(r"open_ms=\{([^}]*)\}")
_SHARDS = re.compile(r" shards=\[([^\]]*)\]")


@dataclass
class Served:
    """One invocation as the handler saw it: wall-clock arrival and answer, and the
    trace's events in ms after the arrival."""

    id: str
    arrived: float = 0.0
    answered: float = 0.0
    events: dict[str, float] = field(default_factory=dict)
    shards: list[int] = field(default_factory=list)
    open_ms: dict[int, float] = field(default_factory=dict)  # the shards' own recovery
    steps: int = 0

    def at(self, event: str) -> float:
        """The event's wall-clock time (unix s)."""
        return self.arrived + self.events[event] / 1000

    @property
    def took_s(self) -> float:
        return self.answered - self.arrived


def served(lines: list[str]) -> dict[str, Served]:
    """The invocations in `lines` (the handler's output) that were answered."""
    found: dict[str, Served] = {}
    for line in lines:
        if trace := _TRACE.match(line):
            one = found.setdefault(trace.group(1), Served(trace.group(1)))
            event, rest = trace.group(3), trace.group(4)
            one.events.setdefault(event, float(trace.group(2)))
            if event == "received" and (shards := _SHARDS.search(rest)):
                one.shards = [int(i) for i in shards.group(1).split(",") if i.strip()]
            elif event == "opened" and (shards := _OPEN_MS.search(rest)):
                for pair in filter(None, (p.strip() for p in shards.group(1).split(","))):
                    index, _, ms = pair.partition(":")
                    one.open_ms[int(index)] = float(ms)
            elif event == "left" and (steps := re.search(r" steps=(\d+)", rest)):
                one.steps += int(steps.group(1))
        elif stamp := _STAMP.match(line):
            one = found.setdefault(stamp.group(1), Served(stamp.group(1)))
            one.arrived, one.answered = float(stamp.group(2)), float(stamp.group(3))
    return {key: one for key, one in found.items() if one.answered}


# -- the processes ------------------------------------------------------------------------


def _with_env(env: dict[str, str], args: list[str]) -> list[str]:
    """`args` run under `env` (Child takes no environment of its own): `/usr/bin/env
    K=V ... program`, which execs the program in the same process."""
    program = shutil.which("env") or "/usr/bin/env"
    return [program, *(f"{key}={value}" for key, value in env.items()), *args]


def _profiled(args: list[str], profile: Path | None) -> list[str]:
    """`python -m X ...` under cProfile, its stats written to `profile` at a clean exit."""
    if profile is None:
        return args
    assert args[1] == "-m", args
    return [args[0], "-m", "cProfile", "-o", str(profile), *args[1:]]


def _profiled_uvicorn(profile: str, host: str, port: int, loop: str) -> None:
    """uvicorn serving `app` under cProfile, the stats written to `profile` as it stops.
    (`python -m cProfile -m uvicorn` writes nothing: after its graceful shutdown uvicorn
    raises the SIGTERM it caught again, under the handler that was there before it, the
    default one, which ends the process; here that handler is one that ignores it.)"""
    import cProfile
    import signal

    import uvicorn

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `handlers`, as with -m
    signal.signal(signal.SIGTERM, lambda *_: None)
    windows = bool(os.environ.get("FUSEE_BENCH_PROFILE_WINDOWS"))
    # The windows' profile counts CPU time (the thread's), not wall time: on a shared
    # machine a send's wall time is mostly the wait for a core.
    profiler = cProfile.Profile(time.thread_time) if windows else cProfile.Profile()
    if windows:
        # Only between SIGUSR1 and SIGUSR2 (bench/wake_cpu.py's windows).
        signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
        signal.signal(signal.SIGUSR2, lambda *_: profiler.disable())
    else:
        profiler.enable()
    try:
        uvicorn.run("_invoke_procs:app", host=host, port=port, loop=loop)
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def server_args(
    dir: Path, port: int, handler_port: int, secret_file: Path, profile: Path | None, trace: bool
) -> list[str]:
    args = [sys.executable, "-m", "fusee", "server", "--dir", str(dir), "--shards", "4"]
    args += ["--listen", f"127.0.0.1:{port}", "--invoke", f"http://127.0.0.1:{handler_port}/"]
    args += ["--invoke-secret-file", str(secret_file)]
    return _with_env({"FUSEE_INVOKE_TRACE": "1" if trace else "0"}, _profiled(args, profile))


def handler_args(port: int, server_port: int, secret: str, profile: Path | None, loop: str) -> list[str]:
    env = {
        "FUSEE_URL": f"127.0.0.1:{server_port}",
        "FUSEE_INVOKE_SECRET": secret,
        "FUSEE_WORKFLOWS": "_invoke_procs",
        "FUSEE_INVOKE_TRACE": "1",
    }
    if profile is not None:
        return _with_env(env, [sys.executable, __file__, "--profile", str(profile), str(port), loop])
    args = [sys.executable, "-m", "uvicorn", "_invoke_procs:app", "--app-dir", "bench"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--loop", loop]
    return _with_env(env, args)


def worker_args(server_port: int) -> list[str]:
    """A long-lived worker running these workflows (the lateness row's comparison)."""
    return [sys.executable, __file__, "--worker", f"127.0.0.1:{server_port}"]


async def _long_lived(address: str) -> None:
    import asyncio

    engine = await fusee.Engine.open(
        durability="server", address=address, workflows=[first, fan, nap, parked]
    )
    print("worker ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await engine.close()


if __name__ == "__main__" and sys.argv[1] == "--worker":  # until SIGTERM
    import asyncio
    import contextlib
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_long_lived(sys.argv[2]))
elif __name__ == "__main__":  # the handler under cProfile: --profile PATH PORT LOOP
    _profiled_uvicorn(sys.argv[2], "127.0.0.1", int(sys.argv[3]), sys.argv[4])
