"""`fusee reshard DIR --shards N`: change a closed directory's shard count
(docs/operations.md, *Changing the shard count*).

Three stages. First the directory is opened by an engine that runs no workflow code, and
closed once every shard's outbox is empty: every message between shards is then
delivered and acknowledged, and the clean close checkpoints every shard over its whole
log. So what remains is each shard's run index and the run-store frames it names, with
no message in flight, no dedup table that matters and no log record past a checkpoint.
Second, every indexed run's frame is copied into the new shard its workflow ID routes to
(`crc32(id) % N`, as the engine routes), under `reshard.new`, with a checkpoint per new
shard. Run numbers count per workflow ID, so nothing is renumbered, and no reference to a
run (a parent, a predecessor, a completion token, `ctx.key`) changes. Third, the folders
are swapped (`swap.py`).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from fusee import journal as R
from fusee._errors import RejectedError
from fusee_server import _native, swap

TOOL = "reshard"
SETTLE_S = 30.0  # how long the outboxes may take to empty before the tool gives up


class _Head(msgspec.Struct, array_like=True):
    """A run-store frame's first fields: the records are copied, never decoded."""

    wid: str
    run: int
    records: msgspec.Raw


_decode_head = msgspec.msgpack.Decoder(_Head).decode


@dataclass
class Report:
    before: int
    after: int
    runs: int = 0
    bytes: int = 0
    per_shard: list[int] = field(default_factory=list)
    seconds: float = 0.0
    finished_swap: bool = False  # an interrupted swap was finished first

    def lines(self) -> list[str]:
        if self.before == self.after:
            done = "finished an interrupted swap; " if self.finished_swap else ""
            return [f"{done}the directory has {self.after} shards: nothing to change"]
        spread = ", ".join(str(n) for n in self.per_shard)
        return [
            f"resharded {self.before} -> {self.after} shards: {self.runs} runs, {self.bytes} bytes of journals, "
            f"in {self.seconds:.2f} s",
            f"runs per new shard: {spread}",
        ]


def reshard(root: str | Path, shards: int) -> Report:
    """Change the shard count of the closed directory `root` to `shards`."""
    root = Path(root)
    if not 1 <= shards <= _native.SHARDS_MAX:
        raise RejectedError(f"--shards {shards}: a directory has between 1 and {_native.SHARDS_MAX} shards")
    began = time.monotonic()
    with swap.locked(root):
        finished = swap.resume(root, TOOL)
    before = _shard_count(root)
    report = Report(before, shards, finished_swap=finished)
    if before == shards:
        return report
    asyncio.run(_settle(root))
    with swap.locked(root):
        built = swap.fresh(root, TOOL)
        _copy(root, built, before, shards, report)
        swap.swap(root, TOOL, shards)
    report.seconds = time.monotonic() - began
    return report


def _shard_count(root: Path) -> int:
    """The count the directory's meta names; a refusal (damage, a format to upgrade)
    with the open's own words."""
    directory = _open(root, None)
    try:
        return directory.shards
    finally:
        directory.release()


def _open(root: Path, shards: int | None) -> _native.Directory:
    try:
        return _native.Directory(root, shards)
    except _native.DirectoryError as error:
        raise RejectedError(f"{root}: {error}") from None


async def _settle(root: Path) -> None:
    """Open the directory with no workflow code and close it once no message is in
    flight (see the module's note). Runs whose code is missing wait for it, as at any open
    without their workflow registered."""
    from fusee.engine.engine import Engine  # the engine is only needed by this stage

    engine = await Engine.open(str(root))
    try:
        deadline = time.monotonic() + SETTLE_S
        while True:
            pending = [(s.index, p.msg) for s in engine.by_index.values() for p in s.outbox.pending.values()]
            if not pending:
                break
            if time.monotonic() > deadline:
                shard, msg = pending[0]
                raise RejectedError(
                    f"{root}: {len(pending)} messages between shards were not acknowledged within {SETTLE_S:.0f} s "
                    f"(the first: a {msg.kind} from shard {shard} for {msg.target!r}); nothing was changed"
                )
            await asyncio.sleep(0.02)
    finally:
        await engine.close()


def _copy(root: Path, built: Path, before: int, after: int, report: Report) -> None:
    """Build the new shards under `built`: each old checkpoint's runs, frames copied
    whole into the shard their ID routes to, and a checkpoint of each new shard at
    position 0 of its new, empty log."""
    log = _native.Log(root / "wal", before)
    directory = _open(built, after)
    try:
        new_log = _native.Log(built / "wal", after)
        targets = [_native.Shard(built, j, new_log) for j in range(after)]
        entries: list[list[R.IndexEntry]] = [[] for _ in range(after)]
        keys: list[set[int]] = [set() for _ in range(after)]
        for i in range(before):
            files = _native.Shard(root, i, log)
            found = files.recovered_checkpoint()
            position = found[0] if found is not None else 0
            if log.take_recovered(i, position):
                raise RejectedError(
                    f"{root}: shard {i} has log records after its last checkpoint although it was just closed "
                    "cleanly; nothing was changed"
                )
            if found is None:
                continue
            state = R.decode_checkpoint(found[1])
            for entry in state.runs:
                frame = files.read_run(entry.ref)
                j = zlib.crc32(_decode_head(frame).wid.encode()) % after
                if entry.key in keys[j]:
                    # Two runs whose IDs' 60-bit hashes collide, from two old shards: the
                    # index keys runs by that hash, so one would hide the other.
                    raise RejectedError(
                        f"{root}: two runs whose IDs share an index hash would land in new shard {j}; reshard to "
                        "another count (nothing was changed)"
                    )
                keys[j].add(entry.key)
                entry.ref = targets[j].append_run(targets[j].runs_len, frame)
                entries[j].append(entry)
                report.runs += 1
                report.bytes += len(frame)
        for j, target in enumerate(targets):
            target.checkpoint(0, R.encode_checkpoint(R.Checkpoint(0, 1, entries[j], [], [])))
        report.per_shard = [len(e) for e in entries]
    finally:
        directory.release()
