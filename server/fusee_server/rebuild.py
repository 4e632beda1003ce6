"""Writing a data directory from what a shard must hold, through this release's own
writer: `fusee upgrade` (from an earlier format) and `fusee restore` (from a backup) both
end here, so a rebuilt directory is one this release wrote, whatever it came from.

A shard's image is its checkpoint state, the run-store frames that state references (in
order from offset 0: appended again they land at the same offsets, so the run index's
offsets stay true) and the log records after the checkpoint. The checkpoint is written
at position 0 of a new, empty log, and the records after it become that log's first
records, which the next open replays as it would have replayed them in the old log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fusee import journal as R
from fusee_server import _native


@dataclass
class ShardImage:
    position: int = 0  # the checkpoint's log position in the old log (0: none)
    state: bytes | None = None  # the checkpoint's msgpack state
    frames: list[bytes] | None = None  # the run store's referenced prefix, frame by frame
    records: list[bytes] | None = None  # the log's records after the checkpoint


def rebuild(root: Path, shards: list[ShardImage]) -> tuple[int, int]:
    """Create the directory `root` holding `shards`; returns (frames, records) written."""
    frames = records = 0
    directory = _native.Directory(root, len(shards))
    try:
        log = _native.Log(root / "wal", len(shards))
        for i, image in enumerate(shards):
            files = _native.Shard(root, i, log)
            for frame in image.frames or ():
                files.append_run(files.runs_len, frame)
                frames += 1
            if image.records:
                log.stage_many(i, image.records)
                records += len(image.records)
            if image.state is not None:
                state = R.decode_checkpoint(image.state)
                state.position = 0  # the new log's records after it are the old ones after it
                files.checkpoint(0, R.encode_checkpoint(state))
        log.write()
    finally:
        directory.release()
    return frames, records
