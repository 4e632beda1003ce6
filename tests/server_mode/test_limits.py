"""Limits on a worker of a real server (docs/limits.md, *Server mode*): not built yet, so
refused loudly instead of enforced per worker."""

from __future__ import annotations

import pytest

import fusee
from fusee import RejectedError


@fusee.workflow
async def limited(ctx: fusee.Ctx, x: int) -> int:
    return await ctx.step("call", lambda: x, limit="api")


async def test_a_worker_refuses_limits_instead_of_bounding_each_worker_alone(start_server):
    server = start_server(shards=1)
    engine = await fusee.Engine.open(workflows=[limited], durability="server", address=server.address())
    try:
        with pytest.raises(RejectedError, match="not available in server mode"):
            await engine.limit("api", concurrent=4)
        run = await engine.start(limited, "l-1", 3)
        with pytest.raises(fusee.StepError, match="not available in server mode"):
            await run.result()
        kinds = [type(rec).__name__ for rec in (await run.describe()).journal]
        assert "Attempt" not in kinds and "StepFailed" in kinds  # failed at once, no retry
    finally:
        await engine.close()
