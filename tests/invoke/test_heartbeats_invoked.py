"""A step longer than an invocation's budget that heartbeats its progress: every budget
end hands the run back, and the attempt in the next invocation resumes from the last
durable heartbeat instead of from the start (docs/engine.md, *Heartbeats*). Real
processes on loopback: `fusee server --invoke-config`, uvicorn serving handlers/asgi.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.cluster import Cluster, metrics, quiet
from tests.support.procs import Proc, steps_seen

BUDGET_MS = 1000
PAGES = 40
PAGE_S = 0.1  # 4 s of pages: three budget ends at least


async def test_a_heartbeating_step_resumes_from_its_progress_after_each_budget_handback(
    procs: list[Proc], tmp_path: Path
):
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    server = cluster.start_invoked_config(budgetMs=BUDGET_MS)
    client = await cluster.client()
    await quiet(client)
    await client.start("pager", "pager-1", {"pages": PAGES, "page_s": PAGE_S})
    assert await asyncio.wait_for(client.run("pager-1").result(), 60) == PAGES
    notes = steps_seen(cluster.steps)[("pager-1", 0)]
    starts = [int(n.split(":")[1]) for n in notes if n.startswith("start:")]
    pages = [int(n.split(":")[1]) for n in notes if n.startswith("page:")]
    assert len(starts) >= 4, f"expected three handbacks at least: {notes}"
    assert starts[0] == 0
    # Each attempt began where the last durable heartbeat left the one before: just after
    # the last page finished (its heartbeat said so), or at that page again when the
    # handback caught its heartbeat before the flush; a page cut mid-way never counts.
    at = 0
    done_before: list[int] = []
    for note in notes:
        kind, n = note.split(":")
        if kind == "start":
            if done_before:
                assert int(n) >= max(done_before), (note, notes)
                assert int(n) <= max(done_before) + 1, (note, notes)
            at = int(n)
        else:
            assert int(n) == at, (note, notes)  # pages in order, from where it began
            at += 1
            done_before.append(int(n))
    assert sorted(set(pages)) == list(range(PAGES))
    assert len(pages) - PAGES <= len(starts), f"{len(pages) - PAGES} pages done again: {notes}"
    # The budget ends were handbacks with progress: never backed off as a stall.
    assert not [line for line in server.lines if "before any step finished" in line]
    assert (await metrics(client))["noProgress"] == 0
    await client.close()
