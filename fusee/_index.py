"""The run index: what a shard keeps in memory for each run it does not hold loaded.

A parked run costs one dict slot keyed by a 60-bit hash of its workflow ID (an ID string
would cost more than the rest together) whose value packs its run-store offset, run
number, type and status into one int, plus a slot in the due-time bucket of its next
timer. The ID itself lives in the run's frame; a lookup by ID is checked against it when
the frame is read, and a run whose hash collides with another's is simply kept loaded.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator

from fusee._messages import IndexEntry

STATUSES = ("parked", "waiting_for_code", "ok", "failed", "cancelled", "timed_out", "terminated", "continued")
_STATUS_CODE = {name: code for code, name in enumerate(STATUSES)}
BUCKET_MS = 100


def key_of(wid: str) -> int:
    return int.from_bytes(hashlib.blake2b(wid.encode(), digest_size=8).digest(), "big") >> 4


class RunIndex:
    def __init__(self) -> None:
        self._table: dict[int, int] = {}
        self._types: list[str] = []
        self._type_ids: dict[str, int] = {}
        self._buckets: dict[int, list[int]] = {}
        self._bucket_heap: list[int] = []

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, wid: str) -> bool:
        return key_of(wid) in self._table

    def put(self, wid: str, entry: IndexEntry) -> None:
        self.put_key(key_of(wid), entry)

    def put_key(self, key: int, entry: IndexEntry) -> None:
        type_id = self._type_ids.get(entry.type)
        if type_id is None:
            type_id = self._type_ids[entry.type] = len(self._types)
            self._types.append(entry.type)
        self._table[key] = (((entry.ref << 16 | type_id) << 32 | entry.run_no) << 4) | _STATUS_CODE[
            entry.status
        ]
        if entry.due and entry.status == "parked":
            bucket = entry.due // BUCKET_MS
            keys = self._buckets.get(bucket)
            if keys is None:
                keys = self._buckets[bucket] = []
                heapq.heappush(self._bucket_heap, bucket)
            keys.append(key)

    def collides(self, wid: str) -> bool:
        """Whether another run already holds this ID's hash (the caller keeps it loaded)."""
        return key_of(wid) in self._table

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
        return None if packed is None else self._unpack(key, packed, wid)

    def _unpack(self, key: int, packed: int, wid: str) -> IndexEntry:
        status = STATUSES[packed & 0xF]
        packed >>= 4
        run = packed & 0xFFFFFFFF
        packed >>= 32
        entry = IndexEntry(wid, run, self._types[packed & 0xFFFF], status, packed >> 16)
        entry.key = key
        return entry

    def entries(self) -> Iterator[IndexEntry]:
        """Every entry, IDs unknown (they are in the frames), dues from the buckets."""
        dues: dict[int, int] = {}
        for bucket, keys in self._buckets.items():
            for key in keys:
                dues[key] = min(dues.get(key, bucket), bucket)
        for key, packed in self._table.items():
            entry = self._unpack(key, packed, "")
            if entry.status == "parked":
                entry.due = dues.get(key, 0) * BUCKET_MS
            yield entry

    def next_due_ms(self) -> int:
        """The start of the earliest bucket holding a parked run (0: none). Early by up to
        a bucket: a woken run waits for its own timer."""
        heap = self._bucket_heap
        while heap and heap[0] not in self._buckets:
            heapq.heappop(heap)
        return heap[0] * BUCKET_MS if heap else 0

    def take_due(self, now_ms: int) -> list[int]:
        """Keys of parked runs whose bucket has begun; they are to be loaded."""
        heap, out = self._bucket_heap, []
        while heap and heap[0] * BUCKET_MS <= now_ms:
            bucket = heapq.heappop(heap)
            for key in self._buckets.pop(bucket, []):
                packed = self._table.get(key)
                if packed is not None and STATUSES[packed & 0xF] == "parked":
                    out.append(key)
        return out
