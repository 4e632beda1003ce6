"""A module to name in FUSEE_WORKFLOWS: the handler registers every workflow it defines."""

from __future__ import annotations

import fusee


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("compose", lambda: f"hello {name}")


NOT_A_WORKFLOW = 3


@fusee.workflow("spawn")
async def spawn(ctx: fusee.Ctx, child: str) -> str:
    """Starts a `steps` run (code this module does not have) and leaves it to run."""
    await ctx.start_child("steps", child, 2, parent_close="abandon")
    return child
