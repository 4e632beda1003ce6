"""Schedules on the test kit's virtual clock (docs/schedules.md): a year of a nightly cron
across both daylight-saving changes with crashes, each overlap policy, catch-up after an
outage, backfill, pause/resume/delete, jitter."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

import fusee
from fusee.engine.schedules.times import check_spec, next_after
from fusee.testing import TestEngine

LONDON = ZoneInfo("Europe/London")
HOUR = 3_600_000


@fusee.workflow
async def job(ctx: fusee.Ctx, x: dict) -> dict:
    return x


@fusee.workflow
async def slow(ctx: fusee.Ctx, x: dict) -> str:
    await ctx.sleep("work", "100m")  # outlasts the hourly interval
    return "done"


async def runs_of(t: TestEngine, type_: str) -> dict[str, str]:
    return {r.id: r.status async for r in t.engine.list(type=type_)}


def utc_of(run_id: str) -> datetime:
    return datetime.strptime(run_id.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


RAN: set[tuple[str, int]] = set()  # (workflow ID, run number) of each `noted` run


@fusee.workflow
async def noted(ctx: fusee.Ctx, x: dict) -> None:
    # A step may run again after a crash (the set absorbs that); a second run of one ID
    # would add its own run number.
    await ctx.step("note", lambda: RAN.add((ctx.workflow_id, ctx.run_number)))


async def test_a_nightly_cron_in_london_fires_once_a_day_for_a_year_through_crashes(tmp_path):
    """01:30 in London: on 2026-03-29 it does not exist (clocks go 01:00 -> 02:00) and
    is skipped; on 2026-10-25 it happens twice and runs once, at the first (BST). The
    engine crashes (unflushed records lost) after every tenth fire."""
    RAN.clear()
    t = await TestEngine.open([noted], dir=tmp_path / "data", shards=2)
    try:
        spec = {"cron": "30 1 * * *", "timezone": "Europe/London"}
        await t.engine.schedule("nightly", spec, noted, {})
        crashes = 0
        seen = 0
        for _ in range(365):  # 2026-01-01 to 2027-01-01
            await t.advance("1d")
            if len(RAN) // 10 > seen // 10:
                await t.crash(settle=False)
                crashes += 1
            seen = len(RAN)
        await t.settle()
        assert crashes == 36
        ids = sorted(wid for wid, _ in RAN)
        assert {run for _, run in RAN} == {1}  # no time ran twice
        assert len(ids) == len(set(ids)) == 364
        local = [utc_of(rid).astimezone(LONDON) for rid in ids]
        assert all((when.hour, when.minute) == (1, 30) for when in local)
        days = {when.date() for when in local}
        assert len(days) == 364 and datetime(2026, 3, 29).date() not in days
        autumn = [rid for rid in ids if rid.startswith("nightly@2026-10-25")]
        assert autumn == ["nightly@2026-10-25T00:30:00Z"]  # 01:30 BST, the first of the two
        described = await t.engine.schedules.get("nightly").describe()
        assert (described["fired"], described["errors"], described["skipped"]) == (364, 0, 0)
        await t.check()
    finally:
        await t.close()


@pytest.mark.parametrize(
    ("overlap", "started", "status"),
    [
        # the 01:00 run lasts until 02:40: 02:00 and 04:00 are skipped, 03:00 and 05:00 run
        ("skip", ["01", "03", "05"], {"01": "ok", "03": "ok", "05": "running"}),
        # 02:00 waits for 01:00's end (02:40), 03:00 for 02:00's (04:20); 04:00 finds
        # one waiting already and is skipped; 05:00 waits
        ("buffer-one", ["01", "02", "03"], {"01": "ok", "02": "ok", "03": "running"}),
        ("allow-all", ["01", "02", "03", "04", "05"], {"01": "ok", "02": "ok", "03": "ok", "04": "running"}),
        # each new time cancels the one still running
        (
            "cancel-other",
            ["01", "02", "03", "04", "05"],
            {"01": "cancelled", "02": "cancelled", "03": "cancelled", "04": "cancelled", "05": "running"},
        ),
    ],
)
async def test_each_overlap_policy_against_a_run_that_outlasts_its_interval(overlap, started, status):
    t = await TestEngine.open([slow])
    try:
        s = await t.engine.schedule("hourly", {"every": "1h", "overlap": overlap}, slow, {})
        await t.advance("150m")
        await t.advance("30s")
        # 02:30:30, 02:00 waiting for 01:00's run (buffer-one): the schedule is parked
        # between two looks at that run, not held in memory by a wait
        loaded = any("fusee.schedule/hourly" in shard.runs for shard in t.engine.shards)
        assert loaded is False
        await t.advance("179m")
        await t.advance("30s")
        runs = await runs_of(t, "slow")
        hours = {rid.split("T")[1][:2]: st for rid, st in runs.items()}
        assert sorted(hours) == started
        for hour, expected in status.items():
            assert hours[hour] == expected, (hour, hours)
        running = [h for h, st in hours.items() if st == "running"]
        if overlap != "allow-all":
            assert len(running) <= 1
        described = await s.describe()
        if overlap == "buffer-one":
            assert described["buffered"] == "2026-01-01T05:00:00Z"
            assert described["skipped"] == 1
            # 02:00's run started within a minute of 01:00's end (02:40)
            started = (await t.engine.run("hourly@2026-01-01T02:00:00Z").describe()).journal[0].now
            ended_at = datetime(2026, 1, 1, 2, 40, tzinfo=UTC).timestamp() * 1000
            assert 0 <= started - ended_at <= 60_000
        if overlap == "skip":
            assert described["skipped"] == 2
        await t.check()
    finally:
        await t.close()


@pytest.mark.parametrize(("window", "fired", "missed"), [("4d", 74, 0), ("1d", 26, 48)])
async def test_times_missed_in_an_outage_catch_up_within_the_window_only(window, fired, missed):
    """Down for three days after 02:00: the hours within `catchup_window` of the
    reopening start, oldest first; older ones are counted as missed."""
    t = await TestEngine.open([job])
    try:
        spec = {"every": "1h", "overlap": "allow-all", "catchup_window": window}
        await t.engine.schedule("poll", spec, job, {})
        await t.advance("2h")
        assert len(await runs_of(t, "job")) == 2
        await t.crash(down="3d")
        await t.settle()
        runs = await runs_of(t, "job")
        described = await t.engine.schedules.get("poll").describe()
        assert (len(runs), described["missed"]) == (fired, missed)
        newest = max(utc_of(rid) for rid in runs)
        assert newest == datetime(2026, 1, 4, 2, tzinfo=UTC)
        await t.advance("1h")
        assert len(await runs_of(t, "job")) == fired + 1
    finally:
        await t.close()


async def test_backfill_over_times_that_ran_starts_nothing_twice():
    t = await TestEngine.open([job])
    try:
        s = await t.engine.schedule("hourly", {"every": "1h"}, job, {"k": "v"})
        await t.advance("5h")
        assert len(await runs_of(t, "job")) == 5
        start, end = t.now_ms() - 10 * HOUR, t.now_ms()
        assert await s.backfill(start, end) == {"times": 10, "started": 6, "attached": 4, "error": 0}
        assert await s.backfill(start, end) == {"times": 10, "started": 0, "attached": 10, "error": 0}
        await t.crash()
        s = t.engine.schedules.get("hourly")  # a handle is the engine's: the reopened one now
        assert await s.backfill(start, end + HOUR) == {"times": 11, "started": 0, "attached": 11, "error": 0}
        runs = await runs_of(t, "job")
        assert len(runs) == 11
        for rid in runs:
            assert (await t.engine.run(rid).status()).run == 1
            assert await t.engine.run(rid).result() == {"k": "v"}
    finally:
        await t.close()


async def test_pause_resume_trigger_and_delete():
    t = await TestEngine.open([job, slow])
    try:
        s = await t.engine.schedule("hourly", "0 * * * *", slow, {})
        await t.advance("1h")
        await s.pause()
        assert (await s.describe())["paused"] is True
        await t.advance("2h")  # 02:00 and 03:00 pass while paused: skipped, not caught up
        await s.resume()
        await t.advance("30m")
        assert sorted(await runs_of(t, "slow")) == ["hourly@2026-01-01T01:00:00Z"]
        triggered = await s.trigger()
        assert triggered.id == "hourly@2026-01-01T03:30:00Z"
        await t.advance("30m")
        assert "hourly@2026-01-01T04:00:00Z" not in await runs_of(t, "slow")  # skip: 03:30 runs
        assert [d["name"] for d in await t.engine.schedules.list()] == ["hourly"]
        # Making it again updates it: a new workflow and spec, one schedule run still.
        await t.engine.schedule("hourly", {"every": "1h", "overlap": "allow-all"}, job, {"v": 2})
        await t.advance("1h")
        assert "hourly@2026-01-01T05:00:00Z" in await runs_of(t, "job")
        await s.delete()
        assert await t.engine.schedules.list() == []
        with pytest.raises(fusee.NotFoundError):
            await s.describe()
        await t.advance("3h")
        assert not [rid for rid in await runs_of(t, "job") if rid > "hourly@2026-01-01T05:00:00Z"]
        # what it started keeps running to its end
        assert await t.result(triggered.id) == "done"
    finally:
        await t.close()


async def test_jitter_is_recorded_and_the_run_keeps_its_scheduled_time():
    t = await TestEngine.open([job])
    try:
        await t.engine.schedule("j", {"every": "1h", "jitter": "30m"}, job, {})
        await t.advance("59m")
        await t.crash()
        await t.advance("1h")
        [rid] = await runs_of(t, "job")
        assert rid == "j@2026-01-01T01:00:00Z"
        started = (await t.engine.run(rid).describe()).journal[0].now
        assert 0 <= started - 1_767_229_200_000 < 30 * 60_000
        await t.check()
    finally:
        await t.close()


def test_cron_spec_aliases_and_refusals():
    assert check_spec("@daily")["cron"] == "0 0 * * *"
    spec = fusee.ScheduleSpec(every="5m", timezone="Europe/London", overlap="buffer-one", jitter="10s")
    assert check_spec(spec) | {"catchup_window_ms": 0} == {
        "cron": None,
        "every_ms": 300_000,
        "timezone": "Europe/London",
        "overlap": "buffer-one",
        "catchup_window_ms": 0,
        "jitter_ms": 10_000,
        "paused": False,
    }
    assert check_spec({"cron": "@hourly", "timezone": "Europe/London"})["timezone"] == "Europe/London"
    for bad in ("* * *", "61 * * * *", {"cron": "* * * * *", "every": "1h"}, {"every": "1h", "overlap": "x"}):
        with pytest.raises(fusee.RejectedError):
            check_spec(bad)
    with pytest.raises(fusee.RejectedError):
        check_spec({"cron": "@daily", "timezone": "Mars/Olympus"})


def test_every_half_hour_in_london_skips_the_gap_and_runs_the_doubled_hour_once():
    spec = check_spec({"cron": "*/30 * * * *", "timezone": "Europe/London"})

    def day(start: datetime) -> list[str]:
        at, out = int(start.timestamp() * 1000), []
        end = at + 4 * HOUR
        while (at := next_after(spec, at)) < end:
            out.append(datetime.fromtimestamp(at / 1000, LONDON).strftime("%H:%M%z"))
        return out

    spring = day(datetime(2026, 3, 29, 0, 0, tzinfo=UTC))  # 01:00-02:00 local never happens
    assert "01:00+0000" not in spring and "01:30+0000" not in spring
    assert spring[:3] == ["00:30+0000", "02:00+0100", "02:30+0100"]
    autumn = day(datetime(2026, 10, 24, 23, 0, tzinfo=UTC))
    assert autumn[:5] == ["00:30+0100", "01:00+0100", "01:30+0100", "02:00+0000", "02:30+0000"]


async def test_a_delayed_start_exists_at_once_and_waits_through_a_reopen(tmp_path):
    t = await TestEngine.open([job], dir=tmp_path / "data")
    try:
        began = t.now_ms()
        run = await t.engine.start(job, "later", {"x": 1}, delay="1h")
        assert (await run.status()).status == "running"
        assert (await t.journal("later"))[0]["not_before"] == began + HOUR  # shown when set
        at = datetime.fromtimestamp((began + 2 * HOUR) / 1000, UTC)
        await t.engine.start(job, "at-two", {"x": 2}, at=at)
        await t.advance("30m")
        await t.crash(settle=False)
        assert (await t.engine.run("later").status()).status == "running"
        assert await t.result("later") == {"x": 1}
        assert t.now_ms() == began + HOUR
        await t.crash()
        assert await t.result("at-two") == {"x": 2}
        assert t.now_ms() == began + 2 * HOUR
        with pytest.raises(fusee.RejectedError):
            await t.engine.start(job, "both", {}, delay="1h", at=at)
        await t.check()
    finally:
        await t.close()


async def test_a_new_spec_starts_from_now_and_catches_up_none_of_its_earlier_times():
    t = await TestEngine.open([job])
    try:
        await t.engine.schedule("s", "@daily", job, {})
        await t.advance("6h")
        assert await runs_of(t, "job") == {}
        await t.engine.schedule("s", {"every": "1h"}, job, {})
        await t.advance("90m")
        assert sorted(await runs_of(t, "job")) == ["s@2026-01-01T07:00:00Z"]
        assert len(await t.engine.schedules.list()) == 1
    finally:
        await t.close()


CRASH = {"armed": False, "engine": None}


@fusee.workflow
async def crasher(ctx: fusee.Ctx, x: dict) -> str:
    def note() -> str:
        if CRASH["armed"]:
            # The process dies here: this run's start is durable (its step runs after
            # it), the schedule's record of having started it is not yet.
            CRASH["armed"] = False
            CRASH["engine"].abandon()
        return "noted"

    return await ctx.step("note", note)


async def test_a_fire_lost_in_a_crash_after_its_start_attaches_to_the_run_it_started():
    t = await TestEngine.open([crasher], flush_on_turn=True)
    try:
        await t.engine.schedule("c", {"every": "1h"}, crasher, {})
        CRASH.update(armed=True, engine=t.engine)
        await t.advance("1h")
        assert t.engine.closed and not CRASH["armed"]
        await t.crash(settle=False)
        await t.advance("1m")
        assert await t.result("c@2026-01-01T01:00:00Z") == "noted"
        assert (await t.engine.run("c@2026-01-01T01:00:00Z").status()).run == 1
        # The fire's step ran again after the crash and found the run it had started.
        done = [r["value"] for r in await t.journal("fusee.schedule/c") if r["kind"] == "StepDone"]
        assert done == [[["attached", 1_767_229_200_000, "c@2026-01-01T01:00:00Z"]]]
        described = await t.engine.schedules.get("c").describe()
        assert (described["fired"], described["errors"]) == (1, 0)
    finally:
        await t.close()
