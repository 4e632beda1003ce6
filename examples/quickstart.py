"""The quickstart: a workflow composes a greeting in a step, pauses, then waits for an
approval signal, in local mode (a data directory, `./.fusee/quickstart`). Run it with
`scripts/quickstart`; kill it during the pause and run it again: the run resumes and
`compose` does not run twice."""

from __future__ import annotations

import asyncio

import fusee

approve = fusee.signal("approve", bool)


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    greeting = await ctx.step("compose", lambda: f"hello {name}")
    await ctx.sleep("pause", "1s")
    ok = await ctx.wait_for(approve, timeout="1h")
    return greeting if ok else f"{greeting} (not approved)"


async def main() -> None:
    async with await fusee.Engine.open(".fusee/quickstart", workflows=[greet]) as engine:
        # A run left by an earlier, killed invocation is picked up; a finished one is
        # followed by a new run.
        run = await engine.start(greet, "greet-1", "world", id_policy={"running": "use-existing"})
        print("started greet-1; it composes its greeting, pauses for a second, then waits for approval")
        await asyncio.sleep(1.2)
        await run.signal(approve, True)
        print("approved:", await run.result())
        print("its journal:")
        for record in (await run.describe()).journal:
            print("  ", type(record).__name__, getattr(record, "name", "") or getattr(record, "status", ""))


if __name__ == "__main__":
    asyncio.run(main())
