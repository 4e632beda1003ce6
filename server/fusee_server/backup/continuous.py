"""Continuous backup of a data directory to a target (docs/backup.md).

A thread of its own, beside the log's writer: every `upload_interval` it reads what is
already durable (the log's records through `Log.read_records`, checkpoint files, the run
store's prefix they reference) and uploads what the target lacks, then records a restore
point and replaces the manifest. The write path never waits for it. What it has not
uploaded yet the log keeps: `hold` lowers the positions retirement may pass, so a
segment is retired only once the backup holds its records too.

A failing target is retried with a backoff; the backup says so on stderr once when it
starts failing and once when it catches up, and `status()` (the server's `/metrics`)
shows the lag meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fusee._backoff import Backoff
from fusee._errors import IoError
from fusee_server import _native
from fusee_server.backup import manifest as M
from fusee_server.backup.targets import Target

logger = logging.getLogger("fusee.backup")

STATE = "backup.json"  # in the data directory: the timeline and what is uploaded
CHUNK_BYTES = 8 << 20  # log records per object, about
THIN_AFTER_MS = 10 * 60_000
CLOSE_WAIT_S = 30.0  # a close waits this long for the last upload to a failing target


@dataclass
class Options:
    upload_interval_s: float = 1.0
    resolution_s: float = 1.0
    retention_s: float = 7 * 86400.0


def now_ms() -> int:
    return int(time.time() * 1000)


def newest_checkpoint(folder: Path, shard: int) -> tuple[int, int, bytes] | None:
    """(position, run-store prefix, file bytes) of a shard's newest intact checkpoint
    (docs/FORMAT.md, *Checkpoint*)."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith("checkpoint-") and n.endswith(".fck")]
    except FileNotFoundError:
        return None
    for name in sorted(names, reverse=True):
        try:
            data = (folder / name).read_bytes()
        except FileNotFoundError:
            continue  # replaced by a newer one meanwhile
        if len(data) < 44 or data[:4] != b"FCKP":
            continue
        _fmt, index, _gen, position, prefix, length = struct.unpack_from("<IIIQQQ", data, 4)
        if index != shard or len(data) != 40 + length + 4:
            continue
        if M.crc(data[: 40 + length]) != struct.unpack_from("<I", data, 40 + length)[0]:
            continue
        return position, prefix, data
    return None


class Backup:
    def __init__(self, root: Path, log: _native.Log, shards: int, target: Target, options: Options) -> None:
        self.root = root
        self.log = log
        self.shards = shards
        self.target = target
        self.options = options
        self.writer = uuid.uuid4().hex
        state = self._local_state()
        self.timeline_id: str = state.get("timeline") or uuid.uuid4().hex[:12]
        # What the target holds, per shard: the log through `uploaded`, the run store
        # through `runs`, the newest checkpoint copied. Until the first round has read the
        # manifest, the local state says (or, for a new timeline, each newest checkpoint).
        self.uploaded: list[int] = state.get("uploaded") or self._fresh()
        self.runs: list[int] = state.get("runs") or [0] * shards
        self.copied: list[int] = state.get("copied") or [-1] * shards
        self.manifest: M.Manifest | None = None
        self.last_point: M.Point | None = None
        self.lock = threading.Lock()  # the round, against `hold` and `status` readers
        self.wake = threading.Event()
        self.stopping = False
        self.abandoned = False
        self.error: str | None = None
        self.failing_since: float | None = None
        self.stopped_for_good: str | None = None
        self.uploads = 0
        self.uploaded_bytes = 0
        self.thread = threading.Thread(target=self._run, name="fusee-backup", daemon=True)

    # -- what the rest of the storage asks ------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def hold(self, covered: list[int]) -> list[int]:
        """The positions retirement may pass: none past what the target holds."""
        with self.lock:
            return [min(c, u) for c, u in zip(covered, self.uploaded, strict=True)]

    def status(self) -> dict[str, Any]:
        """The lag (seconds since the newest restore point, while the log has records
        past it), failures and totals; what `/metrics` shows."""
        point = self.last_point
        durable = [self.log.durable(i) for i in range(self.shards)]
        behind = point is None or any(d > p for d, p in zip(durable, point.positions, strict=True))
        lag = (now_ms() - point.at_ms) / 1000 if behind and point is not None else 0.0
        return {
            "target": self.target.url,
            "timeline": self.timeline_id,
            "lag_s": lag if point is not None or not any(durable) else float("inf"),
            "failing": self.failing_since is not None,
            "error": self.stopped_for_good or self.error,
            "uploads": self.uploads,
            "uploaded_bytes": self.uploaded_bytes,
            "last_point_ms": point.at_ms if point is not None else None,
        }

    def abandon(self) -> None:
        """Stop at once, as a crash would: no last upload."""
        self.abandoned = True
        self.wake.set()

    def stop(self) -> None:
        """The last upload of everything, waited for (up to CLOSE_WAIT_S while the target
        fails), then the thread ends."""
        self.stopping = True
        self.wake.set()
        self.thread.join(CLOSE_WAIT_S + self.options.upload_interval_s + 5)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff(0.5, 30.0)
        close_deadline: float | None = None
        while not self.abandoned:
            if self.stopping and close_deadline is None:
                close_deadline = time.monotonic() + CLOSE_WAIT_S
            try:
                final = self.round()
            except Exception as error:  # noqa: BLE001 - any failure of the target is retried
                if self.stopped_for_good is not None:
                    logger.error("fusee: backup to %s stopped: %s", self.target.url, self.stopped_for_good)
                    return
                self._failed(error)
                if close_deadline is not None and time.monotonic() > close_deadline:
                    logger.error(
                        "fusee: backup to %s: the last upload did not complete: %s", self.target.url, error
                    )
                    return
                self.wake.wait(backoff.next())
                continue
            backoff.reset()
            self._caught_up()
            if final or self.abandoned:
                return
            self.wake.wait(self.options.upload_interval_s)

    def _failed(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            logger.warning(
                "fusee: backup to %s is failing (%s); retrying with backoff, the log keeps what is not uploaded",
                self.target.url,
                self.error,
            )

    def _caught_up(self) -> None:
        if self.failing_since is not None:
            logger.warning(
                "fusee: backup to %s caught up after %.1f s of failures",
                self.target.url,
                time.monotonic() - self.failing_since,
            )
        self.failing_since = None
        self.error = None

    def round(self) -> bool:
        """One upload round (see the module's note). Raises on any failure of the target;
        the next round starts over from what the manifest says."""
        manifest, timeline = self._current()
        final = self.stopping  # a round begun before the close was asked for is not the last
        # Checkpoints first, then the cut: every checkpoint copied is at or before it (a
        # checkpoint is written only once the log through its position is durable), so
        # each shard of the cut has a base to restore from.
        changed = False
        for i in range(self.shards):
            changed |= self._checkpoint(timeline, i)
        positions = self.consistent_positions()
        # The point's time is when the positions were read: every record acknowledged
        # before it is in the cut, and none sent after it.
        read_at = now_ms()
        for i in range(self.shards):
            changed |= self._records(timeline, i, positions[i])
        stamp = read_at
        last = timeline.points[-1] if timeline.points else None
        # A point per `resolution` while the log moves, and always the last one at a close.
        spaced = last is not None and stamp - last.at_ms >= self.options.resolution_s * 1000
        if last is None or (positions != last.positions and (spaced or self.stopping)):
            timeline.points.append(M.Point(stamp, positions))
            changed = True
        dropped = self._retain(timeline, stamp) if changed else []
        if changed:
            seen = M.load(self.target)
            if seen is not None and seen.writer != manifest.writer and self.manifest is not None:
                self.stopped_for_good = (
                    f"another process ({seen.writer}) wrote {self.target.url}'s manifest: one directory writes to a "
                    "target at a time"
                )
                raise IoError(self.stopped_for_good)
            M.save(self.target, manifest)
            self.target.delete(dropped)
            self._save_local_state()
        with self.lock:
            self.manifest = manifest
            self.uploaded = [self.through(timeline, i) for i in range(self.shards)]
        self.last_point = timeline.points[-1] if timeline.points else None
        return final

    def _current(self) -> tuple[M.Manifest, M.Timeline]:
        manifest = self.manifest
        if manifest is None:
            manifest = M.load(self.target) or M.Manifest(M.FORMAT, self.shards, self.writer)
            if manifest.shards != self.shards:
                self.stopped_for_good = (
                    f"{self.target.url} holds a backup of {manifest.shards} shards, this directory has {self.shards}: "
                    "give a resharded directory a new target"
                )
                raise IoError(self.stopped_for_good)
            manifest.writer = self.writer
            timeline = manifest.timeline(self.timeline_id)
            if timeline is None:
                timeline = M.Timeline(self.timeline_id, now_ms())
                manifest.timelines.append(timeline)
                self.runs = [0] * self.shards
                self.copied = [-1] * self.shards
                # Records after each newest checkpoint are still in the log (retirement
                # passes only the older retained one); the first round copies it.
                with self.lock:
                    self.uploaded = self._fresh()
            else:  # continue where the manifest says, whatever the local state said
                self.runs = [
                    max([r.end for r in timeline.runs if r.shard == i], default=0) for i in range(self.shards)
                ]
                self.copied = [
                    max([c.position for c in timeline.checkpoints if c.shard == i], default=-1)
                    for i in range(self.shards)
                ]
                with self.lock:
                    self.uploaded = [self.through(timeline, i) for i in range(self.shards)]
            return manifest, timeline
        timeline = manifest.timeline(self.timeline_id)
        assert timeline is not None
        return manifest, timeline

    def consistent_positions(self) -> list[int]:
        """Every shard's durable position, read until two passes agree. Then no record in
        the cut depends on one outside it: a record another depends on was durable before
        the dependent one was staged, so it would have had to become durable after this
        pass read its shard, yet the dependent one was durable before the first pass read
        it (the passes agreeing), which came earlier."""
        read = [self.log.durable(i) for i in range(self.shards)]
        while True:
            again = [self.log.durable(i) for i in range(self.shards)]
            if again == read:
                return read
            read = again

    def _checkpoint(self, timeline: M.Timeline, shard: int) -> bool:
        found = newest_checkpoint(self.root / f"shard-{shard:03}", shard)
        if found is None or (found[0] <= self.copied[shard] and self.copied[shard] >= 0):
            return False
        position, runs_end, data = found
        if runs_end > self.runs[shard]:
            with open(self.root / f"shard-{shard:03}" / "runs-1.dat", "rb") as f:
                f.seek(self.runs[shard])
                chunk = f.read(runs_end - self.runs[shard])
            name = f"{timeline.id}/shard-{shard:03}/runs/{self.runs[shard]:016x}-{runs_end:016x}.dat"
            timeline.runs.append(M.RunsChunk(shard, self.runs[shard], runs_end, self._put(name, chunk)))
            self.runs[shard] = runs_end
        stamp = now_ms()
        name = f"{timeline.id}/shard-{shard:03}/checkpoint-{position:016x}-{stamp}.fck"
        timeline.checkpoints.append(M.CheckpointCopy(shard, position, runs_end, stamp, self._put(name, data)))
        self.copied[shard] = position
        return True

    @staticmethod
    def through(timeline: M.Timeline, shard: int) -> int:
        """The position through which the timeline holds the shard's log: its last chunk,
        or before any, the first checkpoint it copied (records up to it are in it)."""
        logged = [c.last for c in timeline.log if c.shard == shard]
        if logged:
            return max(logged)
        return min([c.position for c in timeline.checkpoints if c.shard == shard], default=0)

    def _records(self, timeline: M.Timeline, shard: int, until: int) -> bool:
        after = self.through(timeline, shard)
        changed = False
        while after < until:
            records = self.log.read_records(shard, after, CHUNK_BYTES)[: until - after]
            if not records:
                break
            last = after + len(records)
            name = f"{timeline.id}/shard-{shard:03}/log/{after + 1:016x}-{last:016x}.rec"
            timeline.log.append(
                M.LogChunk(shard, after + 1, last, self._put(name, msgspec.msgpack.encode(records)))
            )
            after = last
            changed = True
        return changed

    def _put(self, name: str, data: bytes) -> M.Obj:
        obj = M.put(self.target, name, data)
        self.uploads += 1
        self.uploaded_bytes += len(data)
        return obj

    def _retain(self, timeline: M.Timeline, stamp: int) -> list[str]:
        """Drop restore points older than the retention, and the checkpoints and log
        chunks only they needed; returns the objects to delete once the manifest no
        longer names them. Run-store chunks stay: a checkpoint may reference any frame."""
        cutoff = stamp - self.options.retention_s * 1000
        keep = [p for p in timeline.points if p.at_ms >= cutoff] or timeline.points[-1:]
        # Points older than THIN_AFTER_MS are thinned to one a minute: a week of points at
        # one a second would make the manifest, rewritten each round, grow without need.
        thinned: list[M.Point] = []
        for point in keep:
            old = stamp - point.at_ms > THIN_AFTER_MS
            if old and thinned and point.at_ms // 60_000 == thinned[-1].at_ms // 60_000:
                continue
            thinned.append(point)
        keep = thinned
        if len(keep) == len(timeline.points):
            return []
        timeline.points = keep
        oldest = keep[0].positions
        dropped: list[str] = []
        for i in range(self.shards):
            bases = [c for c in timeline.checkpoints if c.shard == i and c.position <= oldest[i]]
            if not bases:
                continue
            base = max(bases, key=lambda c: c.position)
            gone = [c for c in timeline.checkpoints if c.shard == i and c.position < base.position]
            gone_log = [c for c in timeline.log if c.shard == i and c.last <= base.position]
            dropped += [c.obj.name for c in gone] + [c.obj.name for c in gone_log]
            timeline.checkpoints = [c for c in timeline.checkpoints if c not in gone]
            timeline.log = [c for c in timeline.log if c not in gone_log]
        return dropped

    def _fresh(self) -> list[int]:
        found = [newest_checkpoint(self.root / f"shard-{i:03}", i) for i in range(self.shards)]
        return [c[0] if c is not None else 0 for c in found]

    # -- the local state -----------------------------------------------------------------

    def _local_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads((self.root / STATE).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        if state.get("target") != self.target.url or state.get("shards") != self.shards:
            return {}  # another target, or a resharded directory: a new timeline
        return state

    def _save_local_state(self) -> None:
        state = {
            "target": self.target.url,
            "shards": self.shards,
            "timeline": self.timeline_id,
            "uploaded": [max(u, 0) for u in self.uploaded],
            "runs": self.runs,
            "copied": self.copied,
        }
        tmp = self.root / f"{STATE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.root / STATE)
