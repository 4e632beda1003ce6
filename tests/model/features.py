"""The model test's flow-control moves (issue 20): schedules, a limit, debounce and batches,
each made as the Python line the program shows, and the promises they make
(docs/schedules.md, docs/limits.md, docs/coordinators.md), checked after every step next
to the engine's own (checks.py), through crashes, reopenings and deploys:

- `schedule-once`: a time's run `NAME@<time>` is run 1 of its ID (a start attaches, never
  a second run), and the runs a schedule started never end terminated or cancelled (a
  delete leaves them running); after the clock moved far, every one ended ok.
- `schedule-paused`: no time that came while its schedule was paused or deleted has a run
  (a trigger's own run aside).
- `schedule-fires` (after the clock moved far): every time of the `allow-all` schedule
  while it was on has its run; a trigger's run exists once the trigger returned.
- `limit`: the attempts inside the limited step functions (counted there, in this
  process) never exceed the limit's `concurrent` (after a lowering: those then inside,
  until they drop to it) and never begin closer than `1000/per_second` ms; no permit is
  in use once nothing runs; after the clock moved far every limited run ended ok (every
  waiting step got its permit), once the limit was defined.
- `events`: an acknowledged debounce or batch event is in the input of the run its receipt
  names and of no other, once; a batch holds its events in the order they were
  acknowledged, at most `max_events`; a debounced run takes its window's latest input; a
  repeat of an event ID within the dedup window answers the first event's run and adds
  nothing; a window's run is run 1 of its ID, and no run of a window exists that no
  receipt named; after the clock moved far every window's run ended ok.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import fusee
from fusee import journal as R

from .harness import CALL_TIMEOUT_S, STOPPED, Harness, Violation
from .workflows import INSIDE, LEDGER, LIMIT, LIMITED_TYPE, TAKE_TYPE

# name -> (spec, input, interval ms). Only an `allow-all` schedule starts every time; the
# other skips a time while its previous run (12 s) still runs.
SCHEDULES: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    "sa": ({"every": "5s", "overlap": "allow-all"}, {"ms": 300}, 5_000),
    "sb": ({"every": "10s"}, {"ms": 12_000}, 10_000),
}
LIMITED_IDS = ("l1", "l2", "l3")
KEYS = ("k1", "k2")
EVENT_IDS = (None, None, "e1", "e2", "e3")
DEDUP_MS = 20_000
MAX_EVENTS = 3
EVENT_OPTIONS = {
    "debounce": {"window": "1s", "max_wait": "3s", "dedup_window": f"{DEDUP_MS}ms"},
    "batch": {"max_events": MAX_EVENTS, "max_wait": "2s", "dedup_window": f"{DEDUP_MS}ms"},
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def time_of(run_id: str) -> int:
    """The time (Unix ms) in a schedule run's ID `NAME@2026-01-01T00:00:07.500Z`."""
    return (datetime.fromisoformat(run_id.partition("@")[2]) - EPOCH) // timedelta(milliseconds=1)


@dataclass
class Sched:
    exists: bool = False
    loose: bool = False  # a call on it went unanswered (faulty storage)
    on: list[list[int | None]] = field(default_factory=list)  # [from, to] (exclusive, inclusive)

    def open(self, now: int) -> None:
        if not self.on or self.on[-1][1] is not None:
            self.on.append([now, None])

    def close(self, now: int) -> None:
        if self.on and self.on[-1][1] is None:
            self.on[-1][1] = now

    @contextlib.contextmanager
    def unanswered(self) -> Iterator[None]:
        """Faulty storage: a call a shard's stop left unanswered may have applied or not;
        the schedule's times are not checked from then on (its existence neither)."""
        try:
            yield
        except STOPPED:
            self.loose = True
            raise

    def covers(self, at: int) -> bool:
        return any(a is not None and a < at and (b is None or at <= b) for a, b in self.on)


@dataclass
class Window:
    """What the receipts of one window's run promised."""

    kind: str
    key: str
    values: list[int] = field(default_factory=list)  # acknowledged, in order


class Features:
    """The moves and their obligations, on the model's harness."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.sched = {name: Sched() for name in SCHEDULES}
        self.triggers: set[str] = set()
        self.limit_defined = False
        self.windows: dict[str, Window] = {}
        self.never: set[int] = set()  # values of repeats: must land nowhere
        self.seen: dict[tuple[str, str, str], tuple[int, str]] = {}  # event ID -> (first ms, run)
        # Events sent and never answered (a crash came first): each may be in one window.
        self.maybe: dict[int, tuple[str, str]] = {}  # value -> (kind, key)
        self.uncertain: dict[tuple[str, str, str], int] = {}  # event ID -> until (ms)
        self.pending: tuple[str, str, str | None, int] | None = None
        INSIDE.reset()
        INSIDE.now = lambda: h.t.now_ms()

    # -- schedules ----------------------------------------------------------------------

    async def schedule(self, name: str) -> None:
        h = self.h
        spec, value, _ = SCHEDULES[name]
        with self.sched[name].unanswered():
            kind, result = await h.call(
                f"await t.engine.schedule({name!r}, {spec!r}, {TAKE_TYPE!r}, {value!r})",
                lambda: h.t.engine.schedule(name, spec, TAKE_TYPE, value),
            )
        if kind != "ok":
            raise Violation("refusals", f"schedule {name!r} refused: {type(result).__name__}: {result}")
        s = self.sched[name]
        s.exists = True
        s.open(h.t.now_ms())  # (a new spec unpauses: its `paused` is False)

    async def control(self, name: str, op: str) -> None:
        h = self.h
        s = self.sched[name]
        with s.unanswered():
            kind, result = await h.call(
                f"await t.engine.schedules.get({name!r}).{op}()",
                lambda: getattr(h.t.engine.schedules.get(name), op)(),
            )
        now = h.t.now_ms()
        if s.loose:
            if kind == "ok" and op == "trigger":
                self.triggers.add(result.id)
            return
        if kind == "err":
            if isinstance(result, fusee.NotFoundError) and not s.exists:
                return
            raise Violation(
                "refusals", f"{op} of schedule {name!r} refused: {type(result).__name__}: {result}"
            )
        if not s.exists:
            raise Violation("refusals", f"{op} of schedule {name!r}, never made or deleted, was acknowledged")
        if op == "pause":
            s.close(now)
        elif op == "resume":
            s.open(now)
        elif op == "delete":
            s.close(now)
            s.exists = False
        elif op == "trigger":
            self.triggers.add(result.id)
            if h.peek(result.id) is None:
                raise Violation("acknowledged", f"trigger of {name!r} returned {result.id!r}; no such run")
            h.o.min_run[result.id] = 1

    # -- the limit ----------------------------------------------------------------------

    async def define_limit(self, concurrent: int, per_second: int | None) -> None:
        h = self.h
        INSIDE.defining(concurrent)
        kind, result = await h.call(
            f"await t.engine.limit({LIMIT!r}, concurrent={concurrent}, per_second={per_second})",
            lambda: h.t.engine.limit(LIMIT, concurrent=concurrent, per_second=per_second),
        )
        if kind != "ok":
            raise Violation("refusals", f"limit refused: {type(result).__name__}: {result}")
        INSIDE.define(concurrent, per_second, LEDGER.epoch)
        self.limit_defined = h.limit_defined = True

    async def start_limited(self, wid: str, job: dict[str, Any]) -> None:
        h = self.h
        policy = {"running": "use-existing"}
        kind, result = await h.call(
            f"await t.engine.start({LIMITED_TYPE!r}, {wid!r}, {job!r}, id_policy={policy!r})",
            lambda: h.t.engine.start(LIMITED_TYPE, wid, job, id_policy=policy),
        )
        if kind != "ok":
            raise Violation("refusals", f"start of {wid!r} refused: {type(result).__name__}: {result}")
        after = h.peek(wid)
        if after is None:
            raise Violation("acknowledged", f"start of {wid!r} returned but the engine holds no run of it")
        h.o.min_run[wid] = max(h.o.min_run.get(wid, 0), after[0])

    # -- debounce and batches -----------------------------------------------------------

    async def send_then_crash(self, kind: str, key: str, eid: str | None, turns: int) -> None:
        """An event sent, and the process killed `turns` loop turns later: an answer that
        came holds; one that did not promises nothing (the event may be in its window)."""
        value = self.h.unique()
        self.pending = (kind, key, eid, value)
        await self.h.then_crash(lambda: self.send(kind, key, eid, value), turns)
        if self.pending is not None:
            self.unacked(*self.pending)

    def unacked(self, kind: str, key: str, eid: str | None, value: int) -> None:
        self.pending = None
        self.maybe[value] = (kind, key)
        if eid is not None:
            first = self.seen.get((kind, key, eid))
            if first is None or self.h.t.now_ms() >= first[0] + DEDUP_MS:
                # It may have taken the event ID: a repeat may be a new event or not.
                self.uncertain[(kind, key, eid)] = self.h.t.now_ms() + DEDUP_MS

    async def send(self, kind: str, key: str, eid: str | None, value: int | None = None) -> None:
        h = self.h
        value = h.unique() if value is None else value
        options = {**EVENT_OPTIONS[kind], "event_id": eid}
        call = getattr(h.t.engine, kind)
        self.pending = (kind, key, eid, value)
        try:
            answer, result = await h.call(
                f"await t.engine.{kind}({TAKE_TYPE!r}, {key!r}, {value}, {_kw(options)})",
                lambda: call(TAKE_TYPE, key, value, **options),
            )
        except STOPPED:
            self.unacked(kind, key, eid, value)  # (faulty storage: a shard stopped under it)
            raise
        if answer != "ok":
            raise Violation("refusals", f"{kind} event refused: {type(result).__name__}: {result}")
        self.pending = None
        rid, now = result.id, h.t.now_ms()
        if eid is not None and now < self.uncertain.get((kind, key, eid), 0):
            # A repeat of an event ID an unanswered event may have taken: either answer.
            self.uncertain[(kind, key, eid)] = now + DEDUP_MS
            self.maybe[value] = (kind, key)
            return
        first = self.seen.get((kind, key, eid)) if eid is not None else None
        if first is not None and now < first[0] + DEDUP_MS:
            if rid != first[1]:
                raise Violation(
                    "events",
                    f"a repeat of event {eid!r} {now - first[0]} ms after the first answered {rid!r}, "
                    f"the first {first[1]!r}",
                )
            self.never.add(value)
            return
        if eid is not None:
            self.seen[(kind, key, eid)] = (now, rid)
        window = self.windows.setdefault(rid, Window(kind, key))
        if (window.kind, window.key) != (kind, key):
            raise Violation("events", f"{kind} event of {key!r} answered {rid!r}, a run of {window.key!r}")
        window.values.append(value)

    # -- the checks -----------------------------------------------------------------------

    async def check(self, far: bool = False) -> None:
        h = self.h
        with h.calm():
            await h.quiesce()
            rows = [(row.id, row.status) async for row in h.t.engine.list()]
            if INSIDE.broken:
                raise Violation("limit", INSIDE.broken[0])
            await self._check_limit(far)
            try:
                await self._check_schedules(rows, far)
            except Violation as error:
                await self._describe_into(error)
                raise
            await self._check_events(rows, far)

    async def _check_limit(self, far: bool) -> None:
        h = self.h
        if not self.limit_defined:
            return
        try:
            usage = await asyncio.wait_for(h.t.engine.limit_usage(LIMIT), CALL_TIMEOUT_S)
        except TimeoutError:
            raise Violation(
                "no-hang", f"limit_usage({LIMIT!r}) did not answer within {CALL_TIMEOUT_S} s"
            ) from None
        inside = INSIDE.inside[LEDGER.epoch]
        if usage["in_use"] != inside:
            raise Violation("limit", f"limit_usage says {usage} with {inside} attempts inside")
        if far:
            for wid in LIMITED_IDS:
                held = h.peek(wid)
                if held is not None and held[1] != "ok":
                    raise Violation("limit", f"run {held[0]} of {wid!r} is {held[1]} after a minute")

    async def _check_schedules(self, rows: list[tuple[str, str]], far: bool) -> None:
        h = self.h
        now = h.t.now_ms()
        for name, s in self.sched.items():
            mine = {wid: status for wid, status in rows if wid.startswith(name + "@")}
            for wid, status in mine.items():
                held = h.peek(wid)
                if held is not None and held[0] != 1:
                    raise Violation("schedule-once", f"{wid!r} has run {held[0]}: a time ran twice")
                late = far and status != "ok" and await self._began(wid) <= now - 15_000  # (runs take 12 s)
                if status in ("terminated", "cancelled") or late:
                    raise Violation("schedule-once", f"schedule run {wid!r} is {status}")
                if wid not in self.triggers and not s.loose and not s.covers(time_of(wid)):
                    raise Violation(
                        "schedule-paused",
                        f"{wid!r} ran; its schedule was paused or deleted then (on: {s.on})",
                    )
            every = SCHEDULES[name][2]
            if not far or s.loose or SCHEDULES[name][0].get("overlap") != "allow-all":
                continue
            times = {time_of(wid) for wid in mine}
            for a, b in s.on:
                assert a is not None
                at = (a // every + 1) * every
                while at <= min(now, b if b is not None else now):
                    if at not in times:
                        raise Violation(
                            "schedule-fires", f"schedule {name!r} was on at {at} (now {now}); no run of it"
                        )
                    at += every

    async def _began(self, wid: str) -> int:
        """When a run began (a time's run may begin late: its start retried after a fault)."""
        got = await self.h.journal(wid)
        started = got[2][0] if got is not None and got[2] else None
        return started.now if isinstance(started, R.Started) else 0

    async def _describe_into(self, error: Violation) -> None:
        """What the schedules say of themselves, on the failure's report."""
        for name in SCHEDULES:
            try:
                said = await asyncio.wait_for(self.h.t.engine.schedules.get(name).describe(), CALL_TIMEOUT_S)
            except (fusee.FuseeError, TimeoutError) as failed:
                said = repr(failed)
            error.add_note(f"schedule {name!r}: {said}")

    async def _check_events(self, rows: list[tuple[str, str]], far: bool) -> None:
        h = self.h
        landed: dict[int, str] = {}
        for wid, status in rows:
            if "@" not in wid or wid.partition("@")[0] not in KEYS:
                continue
            got = await h.journal(wid)
            assert got is not None
            run, _status, journal = got
            if run != 1:
                raise Violation("events", f"the window of {wid!r} started run {run}")
            started = journal[0]
            assert isinstance(started, R.Started) and started.parent is not None
            kind = "batch" if started.parent.wid.startswith("fusee.batch/") else "debounce"
            window = self.windows.get(wid) or Window(kind, wid.partition("@")[0])
            value = fusee._codec.decode(started.input)
            if far and status != "ok":
                raise Violation("events", f"window run {wid!r} is {status} after a minute")
            values = value if window.kind == "batch" else [value]
            for v in values:
                if v in landed or v in self.never:
                    where = f"in {landed[v]!r} too" if v in landed else "a repeat of an event ID"
                    raise Violation("events", f"event {v} is in {wid!r}'s input and {where}")
                landed[v] = wid
            # Events never answered may be in it too (the only ones, in a window no receipt named).
            acked = [v for v in values if self.maybe.get(v) != (window.kind, window.key)]
            if not window.values and acked:
                raise Violation("events", f"run {wid!r} took {acked}; no receipt named it")
            if window.kind == "batch" and (acked != window.values or len(values) > MAX_EVENTS):
                raise Violation(
                    "events", f"batch {wid!r} took {values}; its receipts promised {window.values} in order"
                )
            if window.kind == "debounce" and acked and value != window.values[-1]:
                raise Violation(
                    "events", f"debounced {wid!r} took {value}; its window's latest was {window.values[-1]}"
                )
        if far:
            missing = sorted(set(self.windows) - {wid for wid, _ in rows})
            if missing:
                raise Violation("events", f"windows with acknowledged events never started: {missing}")


def _kw(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())
