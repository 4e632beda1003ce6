"""Debounce and batch coordinators on the test kit's virtual clock (docs/coordinators.md):
windows and max_wait, full batches, event-ID dedup, and a crash at every step of a key's
life with each acknowledged event in exactly one run's input, once."""

from __future__ import annotations

import asyncio
import itertools

import pytest

import fusee
from fusee.testing import TestEngine

SECOND = 1_000


@fusee.workflow
async def reindex(ctx: fusee.Ctx, doc: dict) -> dict:
    return doc


@fusee.workflow
async def ingest(ctx: fusee.Ctx, events: list) -> list:
    return events


async def runs_of(t: TestEngine, type_: str) -> dict[str, str]:
    return {r.id: r.status async for r in t.engine.list(type=type_)}


async def test_debounce_collapses_a_window_into_one_run_with_the_latest_input():
    t = await TestEngine.open([reindex])
    try:
        first = await t.engine.debounce(reindex, "doc-1", {"v": 1}, window="5s")
        await t.advance("3s")
        second = await t.engine.debounce(reindex, "doc-1", {"v": 2}, window="5s")
        assert second.id == first.id and first.id.startswith("doc-1@")
        with pytest.raises(fusee.NotFoundError):
            await first.status()  # the run exists only once the window closes
        await t.advance("4s")  # 7 s after the first start: the window still runs
        assert await runs_of(t, "reindex") == {}
        await t.advance("1s")  # 5 s after the latest
        await first.started()
        assert await t.result(first.id) == {"v": 2}
        # The next start opens a new window, with a new run.
        third = await t.engine.debounce(reindex, "doc-1", {"v": 3}, window="5s")
        assert third.id != first.id
        other = await t.engine.debounce(reindex, "doc-2", {"v": 9}, window="5s")
        assert other.id not in (first.id, third.id)
        await t.advance("5s")
        assert await t.result(third.id) == {"v": 3}
        assert await t.result(other.id) == {"v": 9}
        await t.check()
    finally:
        await t.close()


async def test_debounce_max_wait_caps_a_steady_stream_of_starts():
    t = await TestEngine.open([reindex])
    try:
        started = t.now_ms()
        ids = set()
        for i in range(30):  # one start a second: the 5 s window alone never closes
            ids.add((await t.engine.debounce(reindex, "k", {"i": i}, window="5s", max_wait="20s")).id)
            await t.advance("1s")
        runs = await runs_of(t, "reindex")
        assert len(ids) == 2 and len(runs) == 1  # the second window still runs
        (first,) = runs
        summary = await t.engine.run(first).describe()
        assert summary.journal[0].now - started == 20 * SECOND  # closed by max_wait
        await t.advance("10s")
        results = sorted([await t.result(rid) for rid in ids], key=lambda d: d["i"])
        assert results == [{"i": 19}, {"i": 29}]
    finally:
        await t.close()


async def test_batch_starts_a_run_when_full_or_when_max_wait_passes():
    t = await TestEngine.open([ingest])
    try:
        handles = [await t.engine.batch(ingest, "tenant-7", i, max_events=3, max_wait="2s") for i in range(7)]
        full = [h.id for h in handles]
        assert full[0] == full[1] == full[2] != full[3] == full[4] == full[5] != full[6]
        await t.settle()
        # The two full batches started from the handler, at once; the seventh waits.
        assert await t.result(full[0]) == [0, 1, 2]
        assert await t.result(full[3]) == [3, 4, 5]
        assert set(await runs_of(t, "ingest")) == {full[0], full[3]}
        await t.advance("2s")
        assert await t.result(full[6]) == [6]
        await t.check()
    finally:
        await t.close()


async def test_a_repeated_event_id_adds_nothing_within_the_dedup_window():
    t = await TestEngine.open([ingest])
    try:
        a = await t.engine.batch(ingest, "k", "a", max_events=10, max_wait="1m", event_id="e1")
        again = await t.engine.batch(ingest, "k", "a-again", max_events=10, max_wait="1m", event_id="e1")
        b = await t.engine.batch(ingest, "k", "b", max_events=10, max_wait="1m", event_id="e2")
        assert a.id == again.id == b.id
        await t.advance("1m")
        assert await t.result(a.id) == ["a", "b"]
        # After the batch ran, the ID still answers with its first receipt.
        late = await t.engine.batch(ingest, "k", "a-late", max_events=10, max_wait="1m", event_id="e1")
        assert late.id == a.id
        # Past the dedup window the ID is forgotten, and the idle coordinator ends.
        await t.advance("10m")
        coordinator = t.engine.run("fusee.batch/ingest/k")
        assert (await coordinator.status()).status == "ok"
        fresh = await t.engine.batch(ingest, "k", "a-new", max_events=10, max_wait="1m", event_id="e1")
        assert fresh.id != a.id
        await t.advance("1m")
        assert await t.result(fresh.id) == ["a-new"]
        await t.check()
    finally:
        await t.close()


async def test_an_idle_key_ends_its_coordinator_and_the_next_event_starts_another():
    t = await TestEngine.open([reindex])
    try:
        with pytest.raises(fusee.CodecError):
            await t.engine.debounce(reindex, "k", 1, window="1s")  # reindex takes a dict
        first = await t.engine.debounce(reindex, "k", {"n": 1}, window="1s")
        await t.advance("1s")
        assert await t.result(first.id) == {"n": 1}
        coordinator = t.engine.run("fusee.debounce/reindex/k")
        summary = await coordinator.status()
        assert summary.status == "ok"
        second = await t.engine.debounce(reindex, "k", {"n": 2}, window="1s")
        await t.advance("1s")
        assert await t.result(second.id) == {"n": 2}
        assert (await coordinator.status()).run == summary.run + 1
    finally:
        await t.close()


@pytest.mark.parametrize("kind", ["debounce", "batch"])
async def test_a_crash_after_every_event_keeps_each_acknowledged_event_once(tmp_path, kind):
    """Events to three keys, with the engine crashing (unflushed records lost) after every
    acknowledged event and every clock move: each acknowledged event is in exactly one
    run's input, once, and each window started one run."""
    wf = ingest if kind == "batch" else reindex
    t = await TestEngine.open([wf], dir=tmp_path / "data", shards=2)
    try:
        receipts: dict[int, str] = {}
        for i in range(60):
            key = f"k{i % 3}"
            if kind == "batch":
                run = await t.engine.batch(ingest, key, i, max_events=4, max_wait="3s", event_id=f"e{i}")
            else:
                run = await t.engine.debounce(
                    reindex, key, {"i": i}, window="2s", max_wait="3s", event_id=f"e{i}"
                )
            receipts[i] = run.id
            await t.crash(settle=False)
            if i % 5 == 4:
                await t.advance("1s")
                await t.crash(settle=False)
            if i % 7 == 0:  # the caller's reply was lost: it sends the event again
                again = (
                    await t.engine.batch(ingest, key, i, max_events=4, max_wait="3s", event_id=f"e{i}")
                    if kind == "batch"
                    else await t.engine.debounce(
                        reindex, key, {"i": i}, window="2s", max_wait="3s", event_id=f"e{i}"
                    )
                )
                assert again.id == run.id
        await t.advance("10s")
        by_run: dict[str, list[int]] = {}
        for i, rid in receipts.items():
            by_run.setdefault(rid, []).append(i)
        runs = await runs_of(t, wf.name)
        assert set(runs) == set(by_run)  # every window started its run, and only those
        for rid, events in by_run.items():
            out = await t.result(rid)
            if kind == "batch":
                assert out == events  # each event once, in the order accepted
            else:
                assert out == {"i": max(events)}  # the latest input of the window
            assert (await t.engine.run(rid).status()).run == 1  # one run per window
        await t.check()
    finally:
        await t.close()


ORDER: list[str] = []


@fusee.workflow("report", concurrency=fusee.Concurrency(2, key=lambda job: job["tenant"]))
async def report(ctx: fusee.Ctx, job: dict) -> str:
    await ctx.step("begin", lambda: ORDER.append(ctx.workflow_id))
    await ctx.sleep("work", "10s")
    return ctx.workflow_id


async def test_runs_at_once_admits_in_start_order_through_crashes(tmp_path):
    """Two at a time per tenant: the rest are listed as queued, admitted in the order
    started as turns free, and each once, with crashes in between; result() waits
    through the queue and a cancelled queued run leaves it."""
    ORDER.clear()
    t = await TestEngine.open([report], dir=tmp_path / "data", shards=2)
    try:
        runs = [await t.engine.start(report, f"a{i}", {"tenant": "a"}) for i in range(6)]
        other = await t.engine.start(report, "b0", {"tenant": "b"})
        await t.settle()
        assert sorted(ORDER) == ["a0", "a1", "b0"]  # two of a, and b's own turn
        queued = {r.id async for r in t.engine.list(type="fusee.queued") if r.status == "running"}
        assert queued == {f"fusee.queued/a{i}" for i in range(2, 6)}
        await runs[3].cancel("not needed")
        with pytest.raises(fusee.CancelledError):
            await runs[3].result()
        await t.crash(settle=False)
        await t.advance("10s")  # a0, a1 end: a2 and a4 take their turns
        await t.crash(settle=False)
        assert (await t.engine.run("fusee.queued/a5").status()).status == "running"
        waiter = asyncio.ensure_future(t.engine.run("a5").result())  # waits through the queue
        await t.advance("10s")  # a2, a4 end: a5's turn
        assert not waiter.done()
        await t.advance("10s")
        assert await waiter == "a5"
        await t.crash()
        assert [x for x in ORDER if x.startswith("a")] == ["a0", "a1", "a2", "a4", "a5"]
        assert await t.engine.run(other.id).result() == "b0"
        for i in (0, 1, 2, 4, 5):
            assert (await t.engine.run(f"a{i}").status()).run == 1  # admitted once
        with pytest.raises(fusee.NotFoundError):
            await t.engine.run("a3").status()
        await t.check()
    finally:
        await t.close()


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_crash_a_few_turns_into_each_step_of_the_coordinator(tmp_path, shards):
    """The engine crashes after 0 to 10 turns (records not flushed by then are lost) after
    each acknowledged event, with the clock moved past the batch's max_wait every other
    event: the crash lands in a handler, a timer's firing, the child start or its answer.
    Each acknowledged event is in exactly one run's input, once."""
    t = await TestEngine.open([ingest], dir=tmp_path / "data", shards=shards)
    try:
        receipts: dict[int, str] = {}
        for i in range(44):
            run = await t.engine.batch(ingest, f"k{i % 2}", i, max_events=3, max_wait="2s", event_id=f"e{i}")
            receipts[i] = run.id
            if i % 2:
                t.clock.set(t.now_ms() + 2_500)
            for _ in range(i % 11):
                await asyncio.sleep(0)
            await t.crash(settle=False)
        await t.advance("5s")
        by_run: dict[str, list[int]] = {}
        for i, rid in receipts.items():
            by_run.setdefault(rid, []).append(i)
        assert set(await runs_of(t, "ingest")) == set(by_run)
        for rid, events in by_run.items():
            assert await t.result(rid) == events
        await t.check()
    finally:
        await t.close()


@fusee.workflow("single", concurrency=fusee.Concurrency(1))
async def single(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("work", "1s")
    return n


async def test_one_at_a_time_through_a_crash_a_few_turns_into_every_admission(tmp_path):
    """Limit 1: eight starts, the clock moved a second at a time and the engine crashed
    0 to 10 turns later each time. Each run ran once, none began before the previous
    one ended, in start order."""
    t = await TestEngine.open([single], dir=tmp_path / "data", shards=2)
    try:
        for n in range(8):
            await t.engine.start(single, f"s{n}", n)
        for i in range(24):
            t.clock.set(t.now_ms() + 1_000)
            for _ in range(i % 11):
                await asyncio.sleep(0)
            await t.crash(settle=False)
        await t.advance("10s")
        spans = []
        for n in range(8):
            assert await t.result(f"s{n}") == n
            described = await t.engine.run(f"s{n}").describe()
            assert described.summary.run == 1  # admitted once
            spans.append((described.journal[0].now, n))
        assert [n for _, n in sorted(spans)] == list(range(8))  # in start order
        began = [at for at, _ in spans]
        assert all(b - a >= 1_000 for a, b in itertools.pairwise(began))  # one at a time
        await t.check()
    finally:
        await t.close()
