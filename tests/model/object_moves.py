"""The model test's object moves (docs/objects.md): calls to the keys of the `tally` type
with and without call IDs, calls cut by a crash and sent again with their ID, edits from
outside and shared peeks, each made as the Python line the program shows, with crashes,
reopenings, deploys and storage faults between them. After every step:

- `objects-once`: every acknowledged call's entry is in its key's log exactly once, at the
  position its answer named; an entry no call was acknowledged for is there only if its
  call went unanswered (a crash came first), and at most once;
- `objects-order`: the acknowledged calls of a key (made one after another) are in its log
  in the order they were acknowledged;
- `objects-committed`: no read, from outside or by a shared handler, ever shows the
  exclusive handler's uncommitted `pending` field;
- `objects-ids`: a call sent again with an acknowledged call's ID answers the first
  answer and adds nothing; an edit's field holds the last acknowledged edit's value (or an
  unanswered later one's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .harness import STOPPED, Harness, Violation

OBJECT_KEYS = ("o1", "o2")


@dataclass
class Key:
    acked: list[tuple[int, int, str | None]] = field(default_factory=list)  # (entry, position, call ID)
    maybe: set[int] = field(default_factory=set)  # calls never answered: in the log at most once
    ids: dict[str, tuple[int, int]] = field(default_factory=dict)  # call ID -> (entry, position)
    unanswered: dict[str, int] = field(default_factory=dict)  # call ID -> entry, sent again later
    note: list[Any] = field(default_factory=lambda: [None])  # the values the note may hold now


class ObjectMoves:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.keys = {key: Key() for key in OBJECT_KEYS}

    def _ref_line(self, key: str) -> str:
        return f"t.engine.object('tally', {key!r})"

    async def call(self, key: str, with_id: bool, entry: int | None = None, cid: str | None = None) -> None:
        h, k = self.h, self.keys[key]
        entry = h.unique() if entry is None else entry
        cid = cid if cid is not None else (f"c{entry}" if with_id else None)
        k.maybe.add(entry)  # until it is answered
        if cid is not None:
            k.unanswered[cid] = entry
        try:
            kind, result = await h.call(
                f"await {self._ref_line(key)}.call('add', {entry}, id={cid!r})",
                lambda: h.t.engine.object("tally", key).call("add", entry, id=cid),
            )
        except STOPPED:
            return  # (faulty storage: a shard stopped under it) unanswered
        if kind != "ok":
            raise Violation("refusals", f"a call to {key!r} refused: {type(result).__name__}: {result}")
        if cid is not None and cid in k.ids:
            if result != k.ids[cid][1]:
                raise Violation("objects-ids", f"{cid!r} sent again answered {result}, first {k.ids[cid][1]}")
            return
        k.maybe.discard(entry)
        k.unanswered.pop(cid, None) if cid is not None else None
        k.acked.append((entry, result, cid))
        if cid is not None:
            k.ids[cid] = (entry, result)

    async def call_then_crash(self, key: str, turns: int) -> None:
        entry = self.h.unique()
        await self.h.then_crash(lambda: self.call(key, True, entry), turns)

    async def again(self, key: str, acked: bool) -> None:
        """A call sent again with an ID: an acknowledged one's, or an unanswered one's."""
        k = self.keys[key]
        pool = {cid: entry for cid, (entry, _) in k.ids.items()} if acked else dict(k.unanswered)
        if not pool:
            return
        cid = sorted(pool)[0]
        await self.call(key, True, pool[cid], cid)

    async def edit(self, key: str) -> None:
        h, k = self.h, self.keys[key]
        value = h.unique()
        k.note.append(value)
        try:
            kind, result = await h.call(
                f"await {self._ref_line(key)}.set_state('note', {value})",
                lambda: h.t.engine.object("tally", key).set_state("note", value),
            )
        except STOPPED:
            return
        if kind != "ok":
            raise Violation("refusals", f"an edit of {key!r} refused: {type(result).__name__}: {result}")
        k.note = [value]

    async def peek(self, key: str) -> None:
        h = self.h
        try:
            kind, result = await h.call(
                f"await {self._ref_line(key)}.call('peek')",
                lambda: h.t.engine.object("tally", key).call("peek"),
            )
        except STOPPED:
            return
        if kind != "ok":
            raise Violation("refusals", f"a peek at {key!r} refused: {type(result).__name__}: {result}")
        if result is not None:
            raise Violation("objects-committed", f"a shared call at {key!r} saw pending entry {result}")

    async def check(self) -> None:
        h = self.h
        with h.calm():
            await h.quiesce()
            await self._check()

    async def _check(self) -> None:
        h = self.h
        for key, k in self.keys.items():
            if not k.acked and not k.maybe and k.note == [None]:
                continue
            kind, state = await h.call(
                f"await {self._ref_line(key)}.state()",
                lambda key=key: h.t.engine.object("tally", key).state(),
            )
            if kind != "ok":
                raise Violation("refusals", f"state() of {key!r} refused: {type(state).__name__}: {state}")
            if "pending" in state:
                raise Violation(
                    "objects-committed", f"{key!r}'s committed state holds pending {state['pending']}"
                )
            log = state.get("log") or []
            if len(log) != len(set(log)):
                raise Violation("objects-once", f"{key!r}'s log holds an entry twice: {log}")
            acked = [entry for entry, _, _ in k.acked]
            stray = [entry for entry in log if entry not in acked and entry not in k.maybe]
            if stray:
                raise Violation("objects-once", f"{key!r}'s log holds {stray}, never called: {log}")
            for entry, position, _ in k.acked:
                if position > len(log) or log[position - 1] != entry:
                    raise Violation("objects-once", f"{key!r}: entry {entry} answered {position}, log {log}")
            in_log = [entry for entry in log if entry in acked]
            if in_log != acked:
                raise Violation(
                    "objects-order", f"{key!r}: acknowledged {acked}, the log holds them as {in_log}"
                )
            if state.get("note") not in k.note:
                raise Violation(
                    "objects-ids", f"{key!r}'s note is {state.get('note')}, expected one of {k.note}"
                )
