"""`fusee upgrade DIR`: convert a closed directory an earlier release wrote to this
release's format (docs/operations.md, *Format versions*).

Formats shipped, oldest first (each directory's `fusee.meta` names its own):

| directory | log | checkpoint | what changed |
| --- | --- | --- | --- |
| 1 | 3 | 1 | the first release: no meta checksum, unstamped batches, no seals |
| 2 | 4 | 2 | this one: docs/FORMAT.md |

Converting format 1 reads the old layout here, with the old release's own rules, and
writes a new directory through this release's writer under `upgrade.new`: each shard's
newest intact checkpoint (its position moved to 0 of the new log), the run-store frames
it references, copied whole at the same offsets, and the shard's log records after it,
written as the first records of the new log. Then the folders are swapped
(`swap.py`), so a crash at any point leaves a directory that either opens as it was
(format 1 refusing with this command's name) or opens converted, or that running the
command again finishes. Damage to acknowledged records refuses, naming the file: the
tool never copies around a hole.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from fusee._errors import IoError, RejectedError
from fusee_server import _native, swap
from fusee_server.rebuild import ShardImage, rebuild

TOOL = "upgrade"
CURRENT = 2  # the directory format this release writes
BLOCK = 4096
BATCH_HEADER = 64
SECTION_HEADER = 16
DAMAGED = "restore the directory from a copy taken while it was closed"


def _crc(data: bytes, crc: int = 0) -> int:
    return int(google_crc32c.extend(crc, data) if crc else google_crc32c.value(data))


@dataclass
class Report:
    format: int  # the directory format found
    shards: int
    runs: int = 0  # frames copied
    records: int = 0  # log records after the checkpoints, copied
    finished_swap: bool = False

    def lines(self) -> list[str]:
        if self.format == CURRENT:
            done = "finished an interrupted swap; " if self.finished_swap else ""
            return [f"{done}the directory is in the current format ({CURRENT}): nothing to convert"]
        return [
            f"converted directory format {self.format} to {CURRENT} ({self.shards} shards): {self.runs} run-store "
            f"frames and {self.records} log records after the checkpoints"
        ]


def upgrade(root: str | Path) -> Report:
    root = Path(root)
    with swap.locked(root):
        finished = swap.resume(root, TOOL)
        found, shards = _meta(root)
        report = Report(found, shards, finished_swap=finished)
        if found == CURRENT:
            return report
        built = swap.fresh(root, TOOL)
        old = _read_v1(root, shards)
        report.runs, report.records = rebuild(built, old)
        swap.swap(root, TOOL, shards)
    return report


def _meta(root: Path) -> tuple[int, int]:
    """(directory format, shard count). Format 1's meta has no checksum; the current
    one's is checked by the open itself."""
    try:
        text = (root / swap.META).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise RejectedError(f"{root}: {swap.META} does not read ({error})") from None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        found, shards = int(fields["format"]), int(fields["shards"])
    except (KeyError, ValueError):
        raise RejectedError(f"{root}: {swap.META} names no format and shard count: {DAMAGED}") from None
    if found not in (1, CURRENT):
        raise RejectedError(
            f"{root}: directory format {found} is newer than this release knows (it writes {CURRENT}): upgrade "
            "Fusee instead"
        )
    if not 1 <= shards <= _native.SHARDS_MAX:
        raise RejectedError(f"{root}: {swap.META} names {shards} shards: {DAMAGED}")
    return found, shards


def _read_v1(root: Path, shards: int) -> list[ShardImage]:
    found = [_read_shard_v1(root, i) for i in range(shards)]
    records = _read_log_v1(root / "wal", shards)
    for i, shard in enumerate(found):
        after = [(p, r) for p, r in records[i] if p > shard.position]
        if after and after[0][0] != shard.position + 1:
            raise IoError(
                f"{root}: shard {i}: its checkpoint covers position {shard.position}, but the log's first record "
                f"of it after that is {after[0][0]}: records are missing; {DAMAGED}"
            )
        shard.records = [r for _, r in after]
    return found


def _read_shard_v1(root: Path, index: int) -> ShardImage:
    folder = root / f"shard-{index:03}"
    shard = ShardImage()
    names = sorted(os.listdir(folder)) if folder.is_dir() else []
    candidates = []
    for name in names:
        stem = name.removeprefix("checkpoint-").removesuffix(".fck")
        if name.startswith("checkpoint-") and name.endswith(".fck"):
            hex_ = stem[:-1] if stem.endswith("b") and len(stem) > 16 else stem
            try:
                candidates.append((int(hex_, 16), name))
            except ValueError:
                continue
    for position, name in sorted(candidates, reverse=True):
        decoded = _decode_checkpoint_v1((folder / name).read_bytes(), index)
        if decoded is not None and decoded[0] == position:
            shard.position, prefix, shard.state = decoded
            shard.frames = _frames_v1(folder / "runs-1.dat", prefix)
            break
    return shard


def _decode_checkpoint_v1(data: bytes, index: int) -> tuple[int, int, bytes] | None:
    if len(data) < 44 or data[:4] != b"FCKP":
        return None
    fmt, shard, _generation, position, prefix, length = struct.unpack_from("<IIIQQQ", data, 4)
    if fmt != 1 or shard != index or len(data) != 40 + length + 4:
        return None
    if _crc(data[: 40 + length]) != struct.unpack_from("<I", data, 40 + length)[0]:
        return None
    return position, prefix, data[40 : 40 + length]


def _frames_v1(path: Path, prefix: int) -> list[bytes]:
    """The frames of a format-1 run store (CRC-32C of the payload only) up to `prefix`."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < prefix:
        raise IoError(f"{path}: {len(data)} bytes, but its checkpoint references {prefix}: {DAMAGED}")
    frames, at = [], 0
    while at < prefix:
        length, crc = struct.unpack_from("<II", data, at) if at + 8 <= prefix else (prefix, 0)
        payload = data[at + 8 : at + 8 + length]
        if at + 8 + length > prefix or _crc(payload) != crc:
            raise IoError(f"{path}: the frame at offset {at} is damaged: {DAMAGED}")
        frames.append(payload)
        at += 8 + length
    return frames


def _read_log_v1(wal: Path, shards: int) -> list[list[tuple[int, bytes]]]:
    """Every shard's records in the format-3 log's chain, with their positions, by the
    rules that release recovered with: from the oldest live segment, batch after batch
    while each continues the chain, on to the next segment whose header continues it."""
    live = []
    for name in sorted(os.listdir(wal)) if wal.is_dir() else []:
        if name.endswith(".wal") and not name.startswith("spare-"):
            data = (wal / name).read_bytes()
            header = _segment_header_v1(data)
            if header is not None:
                live.append((header, name, data))
    if not live:
        raise IoError(f"{wal}: no readable log segment: {DAMAGED}")
    live.sort(key=lambda s: s[0][0])
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(shards)]
    (_, _, seq, prev), _, _ = live[0]
    k, at = 0, BLOCK
    while True:
        _, name, data = live[k]
        batch = _batch_v1(data, at)
        if batch is not None and batch[0] == seq and batch[1] == prev:
            _, _, crc, length, sections = batch
            for shard, first, records in sections:
                if shard >= shards:
                    raise IoError(f"{wal / name}: a batch at offset {at} names shard {shard}: {DAMAGED}")
                out[shard].extend(zip(range(first, first + len(records)), records, strict=True))
            seq, prev, at = seq + 1, crc, at + -(-length // BLOCK) * BLOCK
            continue
        if k + 1 < len(live) and live[k + 1][0][2:] == (seq, prev):
            k, at = k + 1, BLOCK
            continue
        break
    # What that release refused: an intact batch past the end acknowledging the missing
    # one, or a live segment beyond the end (the segments between were lost).
    for j in range(k, len(live)):
        _, name, data = live[j]
        if j > k:
            raise IoError(
                f"{wal / name}: the log's chain ends before this segment: segments were lost; {DAMAGED}"
            )
        for offset in range(at, len(data) - BLOCK + 1, BLOCK):
            later = _batch_v1(data, offset)
            if later is not None and later[3] and struct.unpack_from("<Q", data, offset + 24)[0] >= seq:
                raise IoError(f"{wal / name}: batch {seq} was acknowledged but is damaged or lost: {DAMAGED}")
    return out


def _segment_header_v1(data: bytes) -> tuple[int, int, int, int] | None:
    """(id, size, first_seq, first_prev) of a format-3 segment header, or None."""
    if len(data) < 48 or data[:8] != b"FUSEEWAL" or struct.unpack_from("<I", data, 8)[0] != 3:
        return None
    if _crc(data[:44]) != struct.unpack_from("<I", data, 44)[0]:
        return None
    segment, size, first_seq, first_prev = struct.unpack_from("<QQQI", data, 16)
    return segment, size, first_seq, first_prev


Section = tuple[int, int, list[bytes]]


def _batch_v1(data: bytes, at: int) -> tuple[int, int, int, int, list[Section]] | None:
    """(seq, prev, checksum, length, sections) of an intact format-3 batch at `at`."""
    if at + BATCH_HEADER > len(data) or data[at : at + 4] != b"FBAT":
        return None
    length, seq, prev, count = struct.unpack_from("<IQII", data, at + 4)
    if not BATCH_HEADER <= length <= len(data) - at:
        return None
    crc = struct.unpack_from("<I", data, at + 60)[0]
    body = data[at : at + length]
    if _crc(body[BATCH_HEADER:], _crc(body[:60] + b"\0\0\0\0")) != crc:
        return None
    sections: list[Section] = []
    offset = BATCH_HEADER
    try:
        for _ in range(count):
            shard, n, first = struct.unpack_from("<IIQ", body, offset)
            offset += SECTION_HEADER
            records = []
            for _ in range(n):
                (size,) = struct.unpack_from("<I", body, offset)
                records.append(body[offset + 4 : offset + 4 + size])
                offset += 4 + size
            if offset > length:
                raise struct.error
            sections.append((shard, first, records))
    except struct.error:
        raise IoError(
            f"batch {seq} at offset {at} is intact but its sections do not parse: {DAMAGED}"
        ) from None
    return seq, prev, crc, length, sections
