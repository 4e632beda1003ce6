"""Workflows of the directories kept in tests/server/formats/, written by earlier releases.

Only calls every release has had (`ctx.step`, `ctx.sleep`, `ctx.wait_for`, `ctx.child`),
so `make.py` runs them on the release that wrote a format and the tests run them on this
one, which resumes what the old one left parked or half done.
"""

from __future__ import annotations

from typing import Any

import fusee


@fusee.workflow
async def finished(ctx: Any, n: int) -> int:
    a = await ctx.step("double", lambda: n * 2)
    return int(await ctx.step("plus one", lambda: a + 1))


@fusee.workflow
async def napping(ctx: Any, n: int) -> str:
    # The timer is due long before any test runs: the upgraded directory fires it at open.
    first = await ctx.step("before", lambda: f"n={n}")
    await ctx.sleep("nap", "1s")
    return str(await ctx.step("after", lambda: first + " woke"))


@fusee.workflow
async def sleeper(ctx: Any, n: int) -> int:
    await ctx.step("before", lambda: n)
    await ctx.sleep("long", "3650d")  # parked for good: it must stay parked with its timer
    return n


@fusee.workflow
async def waiter(ctx: Any, n: int) -> str:
    got = await ctx.wait_for("go")
    return f"{n}:{got}"


@fusee.workflow
async def parent(ctx: Any, n: int) -> int:
    child = await ctx.child(finished, f"child-of-{n}", n)
    return int(child) + 1000


WORKFLOWS = [finished, napping, sleeper, waiter, parent]
