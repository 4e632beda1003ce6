"""The run index: what a shard keeps in memory for each run it does not hold loaded.

A parked run costs one dict slot keyed by a 60-bit hash of its workflow ID (an ID string
would cost more than the rest together) whose value packs its run-store offset, run
number, type, status and due-time bucket into one int, plus a slot in the list of that
bucket. The ID itself lives in the run's frame; a lookup by ID is checked against it when
the frame is read, and a run whose hash collides with another's is simply kept loaded.
"""

from __future__ import annotations

import heapq
from _blake2 import blake2b  # hashlib's own BLAKE2, without loading OpenSSL's (cold path)
from collections.abc import Iterable, Iterator
from typing import Any

from fusee.journal import IndexEntry, Status

# Packed as 4 bits, in this order (the final ones last: `_FINAL` and up).
STATUSES = (
    Status.PARKED,
    Status.WAITING_FOR_CODE,
    Status.OK,
    Status.FAILED,
    Status.CANCELLED,
    Status.TIMED_OUT,
    Status.TERMINATED,
    Status.CONTINUED,
)
_STATUS_CODE: dict[str, int] = {name: code for code, name in enumerate(STATUSES)}
_PARKED = _STATUS_CODE[Status.PARKED]
_FINAL = _STATUS_CODE[Status.OK]  # this and later codes: the run ended
BUCKET_MS = 100
# Parked runs are loaded this long before their bucket begins, in the background of the
# shard's loop: a run due just after a bucket's start would otherwise wait for the loads
# of the whole bucket (docs/engine.md, *Parking*). Loaded, a run waits for its own timer.
LOAD_AHEAD_MS = BUCKET_MS
BUCKET_BITS = 42  # due // BUCKET_MS up to the year 9999
BUCKET_MASK = (1 << BUCKET_BITS) - 1


_KEYS: dict[str, int] = {}
_KEYS_MAX = 4096


def key_of(wid: str) -> int:
    # A woken run's ID is hashed several times (its index entry read, popped, put back at
    # its end): a BLAKE2 each, so the last few thousand are kept.
    key = _KEYS.get(wid)
    if key is None:
        if len(_KEYS) >= _KEYS_MAX:
            _KEYS.clear()
        key = _KEYS[wid] = int.from_bytes(blake2b(wid.encode(), digest_size=8).digest(), "big") >> 4
    return key


class RunIndex:
    """Parked and finished runs by ID hash. A parked run's due bucket is packed into its
    value as well as listed in the bucket: a bucket's list is only a hint, checked against
    the value when read, so removing or replacing an entry never leaves a stale due time
    behind (a finished run's old timer would stay the shard's next due time), and a run
    whose bucket was taken for waking keeps its due time until it is loaded (a checkpoint
    taken meanwhile still records when it is due)."""

    def __init__(self) -> None:
        self._table: dict[int, int] = {}
        self._types: list[str] = []
        self._type_ids: dict[str, int] = {}
        self._buckets: dict[int, list[int]] = {}
        self._bucket_heap: list[int] = []
        # Runs with search attributes: their ID, start and attributes, and the keys by
        # each scalar value, so a listing filters them here (docs/engine.md, *Search
        # attributes*). Only runs that set attributes pay for it.
        self.attributed: dict[int, tuple[str, int, dict[str, Any]]] = {}
        self.postings: dict[tuple[str, Any], set[int]] = {}
        self.changes = 0  # counts puts and pops: a checkpoint with none since the last is skipped

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, wid: str) -> bool:
        return key_of(wid) in self._table

    def put(self, wid: str, entry: IndexEntry) -> None:
        self.put_key(key_of(wid), entry)

    def put_key(self, key: int, entry: IndexEntry) -> None:
        self.changes += 1
        type_id = self._type_ids.get(entry.type)
        if type_id is None:
            type_id = self._type_ids[entry.type] = len(self._types)
            self._types.append(entry.type)
        # A parked run's due time wakes it; a finished run's is when its retention ends
        # (it leaves the index then), which wakes nothing.
        bucket = entry.due // BUCKET_MS if entry.due else 0
        status = _STATUS_CODE[entry.status]
        packed = ((entry.ref << 16 | type_id) << 32 | entry.run_no) << 4 | status
        self._table[key] = packed << BUCKET_BITS | bucket
        if key in self.attributed:
            self._unattribute(key)
        if entry.attrs:
            self.attributed[key] = (entry.wid, entry.started, entry.attrs)
            for name, value in entry.attrs.items():
                posting = posting_key(name, value)
                if posting is not None:
                    self.postings.setdefault(posting, set()).add(key)
        if bucket and status == _PARKED:
            keys = self._buckets.get(bucket)
            if keys is None:
                keys = self._buckets[bucket] = []
                heapq.heappush(self._bucket_heap, bucket)
            keys.append(key)

    def collides(self, wid: str) -> bool:
        """Whether another run already holds this ID's hash (the caller keeps it loaded)."""
        return key_of(wid) in self._table

    def holds_key(self, key: int) -> bool:
        return key in self._table

    def get(self, wid: str) -> IndexEntry | None:
        return self.get_key(key_of(wid), wid)

    def get_key(self, key: int, wid: str = "") -> IndexEntry | None:
        packed = self._table.get(key)
        if packed is None:
            return None
        return self._unpack(key, packed, wid)

    def pop(self, wid: str) -> IndexEntry | None:
        return self.pop_key(key_of(wid), wid)

    def pop_key(self, key: int, wid: str = "") -> IndexEntry | None:
        packed = self._table.pop(key, None)
        if packed is None:
            return None
        self.changes += 1
        entry = self._unpack(key, packed, wid)
        if key in self.attributed:
            self._unattribute(key)
        return entry

    def _unattribute(self, key: int) -> None:
        _, _, attrs = self.attributed.pop(key)
        for name, value in attrs.items():
            posting = posting_key(name, value)
            keys = self.postings.get(posting) if posting is not None else None
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.postings[posting]  # type: ignore[arg-type]

    def _unpack(self, key: int, packed: int, wid: str) -> IndexEntry:
        bucket = packed & BUCKET_MASK
        packed >>= BUCKET_BITS
        status = STATUSES[packed & 0xF]
        packed >>= 4
        run = packed & 0xFFFFFFFF
        packed >>= 32
        entry = IndexEntry(wid, run, self._types[packed & 0xFFFF], status, packed >> 16, bucket * BUCKET_MS)
        entry.key = key
        attributed = self.attributed.get(key)
        if attributed is not None:
            entry.wid = wid or attributed[0]
            entry.started, entry.attrs = attributed[1], attributed[2]
        return entry

    def attributed_rows(
        self, keys: Iterable[int]
    ) -> Iterator[tuple[str, int, str, str, int, dict[str, Any]]]:
        """(ID, run number, type, status, start, attributes) of the attributed runs of
        `keys`, unpacked no further than a listing needs (no IndexEntry each)."""
        table, attributed, types = self._table, self.attributed, self._types
        for key in keys:
            packed = table.get(key)
            found = attributed.get(key)
            if packed is None or found is None:
                continue
            packed >>= BUCKET_BITS
            status = STATUSES[packed & 0xF]
            packed >>= 4
            yield found[0], packed & 0xFFFFFFFF, types[(packed >> 32) & 0xFFFF], status, found[1], found[2]

    def entries(self) -> Iterator[IndexEntry]:
        """Every entry, IDs unknown (they are in the frames)."""
        for key, packed in self._table.items():
            yield self._unpack(key, packed, "")

    def _live(self, bucket: int, keys: list[int]) -> list[int]:
        """The keys of a bucket still parked and due in it."""
        table = self._table
        return [
            key
            for key in dict.fromkeys(keys)
            if (packed := table.get(key)) is not None
            and packed & BUCKET_MASK == bucket
            and (packed >> BUCKET_BITS) & 0xF == _PARKED
        ]

    def expired(self, now_ms: int) -> list[int]:
        """Keys of finished runs whose retention ended by `now_ms`."""
        return [
            key
            for key, packed in self._table.items()
            if (packed >> BUCKET_BITS) & 0xF >= _FINAL and 0 < packed & BUCKET_MASK <= now_ms // BUCKET_MS
        ]

    def next_due_ms(self) -> int:
        """The start of the earliest bucket holding a parked run (0: none). Early by up to
        a bucket: a woken run waits for its own timer."""
        heap, buckets = self._bucket_heap, self._buckets
        while heap:
            bucket = heap[0]
            keys = buckets.get(bucket)
            if keys is not None:
                live = self._live(bucket, keys)
                if live:
                    buckets[bucket] = live
                    return bucket * BUCKET_MS
                del buckets[bucket]
            heapq.heappop(heap)
        return 0

    def next_load_ms(self) -> int:
        """When the earliest bucket holding a parked run is to be loaded (0: none):
        LOAD_AHEAD_MS before it begins."""
        due = self.next_due_ms()
        return load_at(due) if due else 0

    def take_due(self, now_ms: int) -> list[int]:
        """Keys of parked runs whose bucket is to be loaded by `now_ms` (it begins within
        LOAD_AHEAD_MS). They keep their due time until they are loaded (the load replaces
        or removes the entry)."""
        heap, out = self._bucket_heap, []
        while heap and heap[0] * BUCKET_MS - LOAD_AHEAD_MS <= now_ms:
            bucket = heapq.heappop(heap)
            out += self._live(bucket, self._buckets.pop(bucket, []))
        return out


def posting_key(name: str, value: Any) -> tuple[str, Any] | None:
    """What an equality on attribute `name` looks up: scalars only (a list or a map is
    matched by a scan). A bool is kept apart from 0 and 1; numbers compare as numbers."""
    if type(value) is bool:
        return (name, ("bool", value))
    if type(value) in (int, float):
        return (name, float(value))
    if type(value) is str:
        return (name, value)
    return None


def load_at(due_ms: int) -> int:
    """When a run parked until `due_ms` is loaded: LOAD_AHEAD_MS before its bucket."""
    return max(1, due_ms // BUCKET_MS * BUCKET_MS - LOAD_AHEAD_MS)
