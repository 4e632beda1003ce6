"""Restoring a backup to a point in time, listing its points, verifying its objects
(docs/backup.md, *Restore points*).

A point is restorable when, for every shard, the timeline holds a checkpoint at or before
the point's position with the run-store bytes it references, and the log's records from
that checkpoint through the point without a gap (or from the shard's first record). The
restore writes, through this release's own writer (`rebuild.py`), exactly those records
after that checkpoint: the directory opens as one would after a crash at that moment.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec

from fusee._errors import IoError, RejectedError
from fusee_server.backup import manifest as M
from fusee_server.backup.targets import Target
from fusee_server.rebuild import ShardImage, rebuild


@dataclass
class Plan:
    timeline: M.Timeline
    point: M.Point
    bases: list[M.CheckpointCopy | None]  # per shard: the checkpoint it starts from


def plan(timeline: M.Timeline, point: M.Point, shards: int) -> Plan | None:
    """How to restore `point`, or None when the timeline cannot."""
    bases: list[M.CheckpointCopy | None] = []
    for i, until in enumerate(point.positions):
        candidates = [c for c in timeline.checkpoints if c.shard == i and c.position <= until]
        base = max(candidates, key=lambda c: c.position, default=None)
        start = base.position if base is not None else 0
        if base is not None and _covered(timeline, i, base.runs_end) is None:
            return None
        if _records(timeline, i, start, until) is None:
            return None
        bases.append(base)
    return Plan(timeline, point, bases)


def _covered(timeline: M.Timeline, shard: int, end: int) -> list[M.RunsChunk] | None:
    chunks, at = [], 0
    for chunk in sorted((r for r in timeline.runs if r.shard == shard), key=lambda r: r.start):
        if at >= end:
            break
        if chunk.start != at:
            return None
        chunks.append(chunk)
        at = chunk.end
    return chunks if at >= end else None


def _records(timeline: M.Timeline, shard: int, start: int, until: int) -> list[M.LogChunk] | None:
    chunks, at = [], start
    for chunk in sorted((c for c in timeline.log if c.shard == shard), key=lambda c: c.first):
        if at >= until:
            break
        if chunk.last <= at:
            continue
        if chunk.first > at + 1:
            return None
        chunks.append(chunk)
        at = chunk.last
    return chunks if at >= until else None


def points(manifest: M.Manifest, timeline: str | None = None) -> list[Plan]:
    """Every restorable point, oldest first, of one timeline or of all."""
    found = []
    for line in manifest.timelines:
        if timeline is not None and line.id != timeline:
            continue
        for point in line.points:
            planned = plan(line, point, manifest.shards)
            if planned is not None:
                found.append(planned)
    return sorted(found, key=lambda p: p.point.at_ms)


def parse_time(text: str) -> int:
    """`--at`: RFC 3339, Unix milliseconds, or `-15m` (s, m, h, d) before now."""
    relative = re.fullmatch(r"-(\d+(?:\.\d+)?)([smhd])", text)
    if relative:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[relative.group(2)]
        return int((time.time() - float(relative.group(1)) * unit) * 1000)
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RejectedError(f"--at {text!r}: expected RFC 3339, Unix milliseconds or -15m") from None
    if moment.tzinfo is None:
        raise RejectedError(f"--at {text!r}: give a time zone (Z or +01:00)")
    return int(moment.timestamp() * 1000)


def restore(target: Target, dir: str | Path, at_ms: int | None = None, timeline: str | None = None) -> Plan:
    """Write the newest restorable point at or before `at_ms` (the newest of all without)
    into `dir`, which must not exist or be empty. Built under a hidden sibling and renamed
    into place: an interrupted restore leaves no partial directory."""
    dir = Path(dir)
    if dir.exists() and (not dir.is_dir() or any(dir.iterdir())):
        raise RejectedError(f"{dir}: a restore writes a new directory; this one exists and is not empty")
    manifest = M.load(target)
    if manifest is None:
        raise RejectedError(f"{target.url}: no backup there (no manifest.json)")
    if timeline is not None and manifest.timeline(timeline) is None:
        ids = ", ".join(t.id for t in manifest.timelines)
        raise RejectedError(f"{target.url}: no timeline {timeline!r} (there are: {ids})")
    candidates = [p for p in points(manifest, timeline) if at_ms is None or p.point.at_ms <= at_ms]
    if not candidates:
        raise RejectedError(f"{target.url}: no restorable point{' at or before that time' if at_ms else ''}")
    chosen = candidates[-1]
    building = dir.with_name(f".{dir.name}.restoring")
    if building.exists():
        shutil.rmtree(building)
    images = [_image(target, chosen, i) for i in range(manifest.shards)]
    rebuild(building, images)
    if dir.exists():
        dir.rmdir()
    os.rename(building, dir)
    return chosen


def _image(target: Target, chosen: Plan, shard: int) -> ShardImage:
    base = chosen.bases[shard]
    start = base.position if base is not None else 0
    image = ShardImage(position=start, records=[])
    if base is not None:
        data = M.fetch(target, base.obj)
        (length,) = struct.unpack_from("<Q", data, 32)
        image.state = data[40 : 40 + length]
        store = b"".join(
            M.fetch(target, c.obj) for c in _covered(chosen.timeline, shard, base.runs_end) or ()
        )
        image.frames = _frames(store[: base.runs_end], target.url, shard)
    for chunk in _records(chosen.timeline, shard, start, chosen.point.positions[shard]) or ():
        records = msgspec.msgpack.decode(M.fetch(target, chunk.obj), type=list[bytes])
        for position, record in enumerate(records, chunk.first):
            if start < position <= chosen.point.positions[shard]:
                image.records.append(record)  # type: ignore[union-attr]
    return image


def _frames(store: bytes, url: str, shard: int) -> list[bytes]:
    """The run store's frames (docs/FORMAT.md, *Run store*), each checked."""
    frames, at = [], 0
    while at < len(store):
        length, crc = struct.unpack_from("<II", store, at)
        payload = store[at + 8 : at + 8 + length]
        expected = M.crc(struct.pack("<I", length) + payload)
        if len(payload) != length or expected != crc:
            raise IoError(f"{url}: shard {shard}'s run store copy is damaged at offset {at}")
        frames.append(payload)
        at += 8 + length
    return frames


def verify(target: Target) -> list[str]:
    """Read every object the manifest names back against its size and CRC-32C; the
    damaged or missing ones, by name."""
    manifest = M.load(target)
    if manifest is None:
        raise RejectedError(f"{target.url}: no backup there (no manifest.json)")
    bad = []
    for line in manifest.timelines:
        for obj in line.objects():
            try:
                M.fetch(target, obj)
            except IoError as error:
                bad.append(str(error))
    return bad
