"""Replacing a closed directory's folders with rebuilt ones, for `fusee reshard` and
`fusee upgrade` (docs/operations.md, *Swapping folders*).

A tool builds the new directory whole under `<dir>/<tool>.new` and syncs it; until then
the directory is as it was, and a crash leaves only `<tool>.new` behind, which the next
run deletes. The swap itself is many renames, so it is framed by two metas. First a
`format=swap` meta, which no build opens: a directory half old, half new is never read.
Then each old folder moves to `<tool>.old` and its new one moves in, and the final meta
names the new shard count. Every step checks what is already done, so running the tool
again after a crash at any point finishes the swap. Only then is `<tool>.old` deleted.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fusee._errors import RejectedError
from fusee_server import _native

META = "fusee.meta"


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the directory's lock (the same `flock` on `fusee.lock` an open takes) while
    a tool works on it: an engine or server that has the directory open refuses it."""
    if not (root / META).exists():
        raise RejectedError(f"{root}: not a Fusee data directory (no {META})")
    fd = os.open(root / "fusee.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RejectedError(
                f"{root}: the directory is open in process {pid}: stop it first (the tool works only on a closed "
                "directory)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def swapping(root: Path) -> tuple[str, int] | None:
    """The tool and shard count of a swap a crash interrupted, from its meta, or None."""
    try:
        text = (root / META).read_text(errors="replace")
    except FileNotFoundError:
        return None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if fields.get("format") != "swap":
        return None
    return fields.get("tool", "reshard"), int(fields.get("shards", "0"))


def fresh(root: Path, tool: str) -> Path:
    """`<dir>/<tool>.new`, empty: what an earlier run left there was never switched to."""
    built = root / f"{tool}.new"
    if built.exists():
        shutil.rmtree(built)
    return built


def folders(root: Path) -> list[str]:
    """The names a swap moves: the log and every shard folder."""
    return sorted(n for n in os.listdir(root) if n == "wal" or n.startswith("shard-"))


def swap(root: Path, tool: str, shards: int) -> None:
    """Move the folders built under `<tool>.new` into place (see the module's note)."""
    built = root / f"{tool}.new"
    old = root / f"{tool}.old"
    _native.write_meta(root, shards, tool)
    old.mkdir(exist_ok=True)
    for name in folders(built):
        if (root / name).exists():
            os.rename(root / name, old / name)  # still the old one: its new one is not in yet
        os.rename(built / name, root / name)
    for name in folders(root):
        if name.startswith("shard-") and int(name[6:]) >= shards:
            os.rename(root / name, old / name)  # a shard a shrink does not keep
    _sync_dir(root)
    _native.write_meta(root, shards)
    finish(root, tool)


def finish(root: Path, tool: str) -> None:
    """Delete what a finished swap (or an abandoned build) left."""
    for leftover in (root / f"{tool}.old", root / f"{tool}.new"):
        if leftover.exists():
            shutil.rmtree(leftover)


def resume(root: Path, tool: str) -> bool:
    """Finish a swap a crash interrupted (whichever tool began it); True when there was
    one. Otherwise clear a finished swap's leftovers."""
    began = swapping(root)
    if began is None:
        finish(root, tool)
        return False
    began_by, shards = began
    swap(root, began_by, shards)
    return True


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
