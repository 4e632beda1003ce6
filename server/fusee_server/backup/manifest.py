"""The manifest: what a backup target holds (docs/backup.md, *Layout*).

One JSON document, replaced whole after each upload round, names every object the backup
needs with its size and CRC-32C, per timeline: the log's record chunks, checkpoints, run
store chunks and restore points. An object is uploaded before a manifest names it and
deleted only once a manifest that no longer names it is in place, so whatever the moment a
process dies, the manifest names only complete objects.
"""

from __future__ import annotations

import google_crc32c
import msgspec

from fusee._errors import IoError
from fusee_server.backup.targets import MANIFEST, Target

FORMAT = 1


class Obj(msgspec.Struct):
    name: str
    size: int
    crc: int


class LogChunk(msgspec.Struct):
    """A shard's log records `first..last` (positions), a msgpack list of them."""

    shard: int
    first: int
    last: int
    obj: Obj


class CheckpointCopy(msgspec.Struct):
    """A shard's checkpoint file as written: its log position and the run-store prefix it
    references."""

    shard: int
    position: int
    runs_end: int
    at_ms: int
    obj: Obj


class RunsChunk(msgspec.Struct):
    """Bytes `start..end` of a shard's run store."""

    shard: int
    start: int
    end: int
    obj: Obj


class Point(msgspec.Struct):
    """A restore point: every shard's durable position at one moment (a cut no record
    crosses the wrong way: see continuous.py, `consistent_positions`)."""

    at_ms: int
    positions: list[int]


class Timeline(msgspec.Struct):
    id: str
    started_ms: int
    parent: str | None = None  # the timeline the directory was restored from
    log: list[LogChunk] = msgspec.field(default_factory=list)
    checkpoints: list[CheckpointCopy] = msgspec.field(default_factory=list)
    runs: list[RunsChunk] = msgspec.field(default_factory=list)
    points: list[Point] = msgspec.field(default_factory=list)

    def objects(self) -> list[Obj]:
        return [c.obj for c in self.log] + [c.obj for c in self.checkpoints] + [c.obj for c in self.runs]


class Manifest(msgspec.Struct):
    format: int
    shards: int
    writer: str  # the backup process that wrote it last: a second writer stops
    timelines: list[Timeline] = msgspec.field(default_factory=list)

    def timeline(self, id: str) -> Timeline | None:
        return next((t for t in self.timelines if t.id == id), None)


def crc(data: bytes) -> int:
    return int(google_crc32c.value(data))


def put(target: Target, name: str, data: bytes) -> Obj:
    target.put(name, data)
    return Obj(name, len(data), crc(data))


def load(target: Target) -> Manifest | None:
    data = target.get(MANIFEST)
    if data is None:
        return None
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as error:
        raise IoError(f"{target.url}: {MANIFEST} does not decode ({error}): the target is damaged") from None
    if manifest.format != FORMAT:
        raise IoError(
            f"{target.url}: {MANIFEST} is of backup format {manifest.format}; this build reads {FORMAT}"
        )
    return manifest


def save(target: Target, manifest: Manifest) -> None:
    target.put(MANIFEST, msgspec.json.encode(manifest))


def fetch(target: Target, obj: Obj) -> bytes:
    """An object's bytes, checked against the manifest: damage is named, never read."""
    data = target.get(obj.name)
    if data is None:
        raise IoError(f"{target.url}: {obj.name} is missing, though the manifest names it")
    if len(data) != obj.size or crc(data) != obj.crc:
        raise IoError(
            f"{target.url}: {obj.name} is damaged (its size or CRC-32C does not match the manifest)"
        )
    return data
