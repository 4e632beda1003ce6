"""`fusee_<counter>{shard="N"}` in the server's `/metrics` (docs/telemetry.md, *Metrics per
shard*): what the server sees of each shard, after real invocations of uvicorn serving
the handler (the `invoked` server of test_http_api.py)."""

from __future__ import annotations

import fusee
from tests.server_mode.test_http_api import invoked, scrape, value
from tests.support.procs import retry
from tests.support.waiting import eventually

__all__ = ["invoked"]  # the fixture, shared

PER_SHARD = ["records", "bytes", "flushes", "flushed_records", "flush_us", "checkpoints", "steps_executed"]


async def test_each_shard_has_its_records_flushes_checkpoints_and_steps(invoked):
    client = await retry(lambda: fusee.Client.connect(invoked.address()))
    run = await client.start("steps", "per-shard-1", 3)
    assert len(await run.result()) == 3
    shard = str(client.shard_of("per-shard-1"))

    async def settled():
        families = await scrape(invoked)
        done = (
            value(families, "fusee_steps_executed", shard=shard) >= 3
            and value(families, "fusee_checkpoints", shard=shard) >= 1
        )
        return families if done else None

    families = await eventually(settled, timeout=20.0, every=0.05)
    for name in PER_SHARD:
        family = families[f"fusee_{name}"]
        assert family.type == "unknown"  # untyped: exposed under its own name
        assert sorted(s.labels["shard"] for s in family.samples) == ["0", "1", "2", "3"]
    records = value(families, "fusee_records", shard=shard)
    assert records >= 5  # its start, three results, its end
    assert value(families, "fusee_bytes", shard=shard) > records * 8
    assert 1 <= value(families, "fusee_flushes", shard=shard) <= records
    assert value(families, "fusee_flushed_records", shard=shard) == records
    assert value(families, "fusee_flush_us", shard=shard) > 0
    others = [s for s in families["fusee_steps_executed"].samples if s.labels["shard"] != shard]
    assert all(s.value == 0 for s in others)
    await client.close()
