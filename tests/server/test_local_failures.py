"""Local mode refuses what it cannot do safely: a second process on a directory, another
shard count, any acknowledgment after a failed flush, a record longer than recovery
reads, and a directory whose damage lost acknowledged records (naming the file)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("nap", "1h")
    return n


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_a_second_process_is_told_which_pid_holds_the_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with await fusee.Engine.open(str(data), workflows=[napper], shards=2):
        child = run_child(
            """
            import asyncio, sys, fusee
            async def main():
                try:
                    await fusee.Engine.open(sys.argv[1], shards=2)
                except fusee.RejectedError as e:
                    print("refused:", e)
            asyncio.run(main())
            """,
            str(data),
        )
    assert f"open in process {os.getpid()}" in child.stdout, child.stdout + child.stderr


async def test_another_shard_count_is_refused_naming_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with await fusee.Engine.open(str(data), workflows=[napper], shards=2) as engine:
        await engine.start(napper, "n-1", 1)
    with pytest.raises(fusee.RejectedError) as refused:
        await fusee.Engine.open(str(data), workflows=[napper], shards=3)
    # It names what to do: the directory's count, or the command that changes it.
    assert "shards=2" in str(refused.value) and "`fusee reshard <dir> --shards 3`" in str(refused.value)
    # Without a count, the directory's own is used; nothing was changed by the refusal.
    async with await fusee.Engine.open(str(data), workflows=[napper]) as engine:
        assert len(engine.shards) == 2
        assert (await engine.run("n-1").status()).status == "running"


def test_after_a_failed_flush_nothing_more_is_acknowledged(tmp_path: Path) -> None:
    """A child limits the size of files it may write (RLIMIT_FSIZE, a real kernel refusal),
    so a log write fails: the start waiting on it gets IoError, later calls too, and a
    reopened directory holds every start that was acknowledged before."""
    data = tmp_path / "data"
    child = run_child(
        """
        import asyncio, resource, signal, sys, fusee

        @fusee.workflow("napper")
        async def napper(ctx, n: int) -> int:
            await ctx.sleep("nap", "1h")
            return n

        async def main():
            engine = await fusee.Engine.open(sys.argv[1], workflows=[napper], shards=1)
            for i in range(5):
                await engine.start(napper, f"ok-{i}", i)
                print("acked", f"ok-{i}", flush=True)
            # Writes past 16 KiB of any file now fail with EFBIG (SIGXFSZ ignored).
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
            failed = 0
            for i in range(50):
                try:
                    await engine.start(napper, f"late-{i}", i)
                    print("acked", f"late-{i}", flush=True)
                except fusee.IoError as error:
                    failed += 1
                    last = error
            print("failed", failed, last, flush=True)
            engine.abandon()

        asyncio.run(main())
        """,
        str(data),
    )
    assert child.returncode == 0, child.stderr
    acked = [line.split()[1] for line in child.stdout.splitlines() if line.startswith("acked")]
    failed = [line for line in child.stdout.splitlines() if line.startswith("failed")]
    assert failed and int(failed[0].split()[1]) >= 1, child.stdout
    assert "failed flush" in failed[0] or "write failed" in failed[0], failed[0]
    late_acked = [wid for wid in acked if wid.startswith("late-")]
    # Once a flush failed, no later start was acknowledged.
    first_failure = int(failed[0].split()[1])
    assert len(late_acked) == 50 - first_failure

    async def reopen() -> set[str]:
        async with await fusee.Engine.open(str(data), workflows=[napper]) as engine:
            return {summary.id async for summary in engine.list()}

    present = asyncio.run(reopen())
    assert set(acked) <= present, f"acknowledged but lost: {set(acked) - present}"


def test_local_mode_without_fusee_server_says_how_to_install_it(tmp_path: Path) -> None:
    child = run_child(
        """
        import asyncio, sys
        sys.modules["fusee_server"] = None  # as if the distribution were not installed
        import fusee
        async def main():
            try:
                await fusee.Engine.open(sys.argv[1])
            except fusee.RejectedError as e:
                print("refused:", e)
        asyncio.run(main())
        """,
        str(tmp_path / "data"),
    )
    assert "fusee-server" in child.stdout and "pip install" in child.stdout, child.stdout + child.stderr


async def test_damage_to_acknowledged_records_refuses_to_open_and_releases_the_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    engine = await fusee.Engine.open(str(data), workflows=[napper], shards=1)
    for i in range(4):
        await engine.start(napper, f"d-{i}", i)  # one batch each
    engine.abandon()  # a crash: no checkpoint, the batches stay in the log
    await engine.storage.abandon()  # type: ignore[attr-defined]
    segment = data / "wal" / "0000000000000001.wal"
    with open(segment, "r+b") as f:
        f.seek(4096 + 70)  # inside the first batch; three later batches prove it was acknowledged
        byte = f.read(1)
        f.seek(4096 + 70)
        f.write(bytes([byte[0] ^ 0xFF]))
    for _ in range(2):  # the second open gets the same answer, not "open in process ..."
        with pytest.raises(fusee.IoError) as refused:
            await fusee.Engine.open(str(data), workflows=[napper])
        assert "batch 1" in str(refused.value) and "acknowledged" in str(refused.value)


# -- regression tests: each failed before its fix --------------------------------------

SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX = 16 << 10, 32 << 10  # small: many rolls


class Reports:
    """Stands where a shard would: what a local shard store reports to it."""

    def __init__(self) -> None:
        self.got: list[int | BaseException] = []
        self.event = asyncio.Event()

    def __call__(self, result: int | BaseException) -> None:
        self.got.append(result)
        self.event.set()

    async def flush(self, store: Any) -> int:
        """Ask for a flush and wait for the store's report."""
        self.event.clear()
        store.flush()
        await asyncio.wait_for(self.event.wait(), 10)
        result = self.got[-1]
        if isinstance(result, BaseException):
            raise result
        return result


async def open_store(storage: Any, index: int) -> tuple[Any, Reports]:
    reports = Reports()
    return await storage.open_shard(index, reports, lambda item: None), reports


async def recovered(store: Any) -> tuple[bytes | None, list[bytes]]:
    """The checkpoint and every record after it, page by page."""
    checkpoint = await store.latest_checkpoint()
    position = checkpoint[0] if checkpoint is not None else 0
    records: list[bytes] = []
    while page := await store.records(position + len(records)):
        records += page
    return (checkpoint[1] if checkpoint is not None else None), records


async def test_checkpoints_whose_positions_end_in_b_are_read_as_theirs(tmp_path: Path) -> None:
    """`checkpoint-000000000000039b.fck` was read as the second copy of position 0x39:
    with both retained positions ending in b, both were declared damaged, the run store
    was cut to nothing and the log under them (retired) was gone."""
    from fusee_server.store import LocalStorage

    data = tmp_path / "data"
    storage = await LocalStorage.open(
        data, 1, segment_bytes_min=SEGMENT_BYTES_MIN, segment_bytes_max=SEGMENT_BYTES_MAX
    )
    store, reports = await open_store(storage, 0)
    frame = store.put_run(b"a parked run's frame")
    for position, state in ((0x39B, b"older"), (0x3AB, b"newer")):
        while store.next_position < position:
            store.append(b"record %d" % store.next_position)
        assert await reports.flush(store) == position
        await store.checkpoint(position, state)
    assert storage.log.segment_ids()[0] > 1, "segments under both checkpoints were retired"
    await storage.close()

    storage = await LocalStorage.open(
        data, 1, segment_bytes_min=SEGMENT_BYTES_MIN, segment_bytes_max=SEGMENT_BYTES_MAX
    )
    try:
        store, _ = await open_store(storage, 0)
        assert await recovered(store) == (b"newer", [])
        assert await store.get_runs([frame]) == [b"a parked run's frame"]
    finally:
        await storage.close()


async def test_a_record_longer_than_recovery_reads_is_refused_and_the_longest_is_recovered(
    tmp_path: Path,
) -> None:
    """A record over 64 MiB was written and acknowledged, then lost at recovery (which
    reads no batch that long). Now staging it fails the flush, naming the limit; one of
    exactly RECORD_BYTES_MAX is written, acknowledged and recovered after a crash."""
    from fusee_server.store import RECORD_BYTES_MAX, LocalStorage

    longest = bytes(range(256)) * (RECORD_BYTES_MAX // 256) + b"x" * (RECORD_BYTES_MAX % 256)
    data = tmp_path / "data"
    storage = await LocalStorage.open(data, 2)
    store, reports = await open_store(storage, 0)
    store.append(b"first")
    store.append(longest)
    assert await reports.flush(store) == 2
    await storage.abandon()  # a crash

    storage = await LocalStorage.open(data, 2)
    try:
        store, reports = await open_store(storage, 0)
        _, records = await recovered(store)
        assert len(records) == 2 and records[1] == longest
        other, other_reports = await open_store(storage, 1)
        other.append(b"x" * (64 << 20))  # a batch of it alone would be over 64 MiB
        with pytest.raises(fusee.IoError, match="RECORD_BYTES_MAX"):
            await other_reports.flush(other)
        other.flush()  # the shard stays stopped: nothing more is written or reported
        other.append(b"more")
        await asyncio.sleep(0.05)
        store.append(b"the other shard goes on")
        assert await reports.flush(store) == 3
        # Checked once a later flush went through the same log, not only after a sleep:
        # nothing more was written or reported for the stopped shard.
        assert len(other_reports.got) == 1 and storage.log.durable(1) == 0
    finally:
        await storage.abandon()


async def test_checkpoints_finish_while_other_work_fills_the_default_executor(tmp_path: Path) -> None:
    """Checkpoints ran on the loop's default executor: once threads of the application
    filled it, a checkpoint never finished and the close hung."""
    loop = asyncio.get_running_loop()
    release = threading.Event()
    started: list[int] = []

    def hold() -> None:
        started.append(1)
        release.wait(60)

    engine = await fusee.Engine.open(str(tmp_path / "data"), workflows=[napper], shards=2)
    held = [loop.run_in_executor(None, hold) for _ in range(64)]  # more than it has threads
    try:
        await eventually(lambda: len(started) >= min(32, (os.cpu_count() or 1) + 4))
        await engine.start(napper, "n-1", 1)
        await asyncio.wait_for(engine.close(), 10)
    finally:
        release.set()
        await asyncio.gather(*held)
    async with await fusee.Engine.open(str(tmp_path / "data"), workflows=[napper]) as engine:
        assert (await engine.run("n-1").status()).status == "running"


@fusee.workflow("stepper")
async def stepper(ctx: fusee.Ctx, n: int) -> list[int]:
    return [await ctx.step(f"s{i}", lambda i=i: n * 10 + i) for i in range(3)]


HOLDING: list[int] = []  # one entry per holder step that began


async def hold_forever() -> None:
    HOLDING.append(1)
    await asyncio.Event().wait()


@fusee.workflow("holder")
async def holder(ctx: fusee.Ctx) -> None:
    # A run in a step keeps its shard from going idle (an idle shard checkpoints).
    await ctx.step("hold", hold_forever)


async def written_dir(data: Path, crash: bool) -> dict[str, list[int]]:
    """Two shards of runs in small segments: parked runs and finished ones. `crash`:
    the process stops without a checkpoint (a held run keeps the shards busy), so the
    log holds every record in several live segments; else a clean close, after which
    checkpoints hold everything and the log moved to an empty segment."""
    from fusee_server.store import LocalStorage

    storage = await LocalStorage.open(
        data, 2, segment_bytes_min=SEGMENT_BYTES_MIN, segment_bytes_max=SEGMENT_BYTES_MAX
    )
    engine = await fusee.Engine.open(workflows=[napper, stepper, holder], storage=storage, park_after="1h")
    results: dict[str, list[int]] = {}
    held = len(HOLDING)
    await engine.start(holder, "holder")
    await eventually(lambda: len(HOLDING) > held)  # its step began: nothing left unawaited
    for i in range(6):
        await engine.start(napper, f"nap-{i}", i)
        results[f"step-{i}"] = await (await engine.start(stepper, f"step-{i}", i)).result()
    if crash:
        engine.abandon()
        await storage.abandon()
    else:
        await engine.close()
    return results


def segments(data: Path) -> list[Path]:
    return sorted(p for p in (data / "wal").iterdir() if not p.name.startswith("spare-"))


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x55]))


def last_batch(segment: Path, end: int) -> int:
    """The offset of the last batch before `end` in a segment (each starts a block)."""
    data = segment.read_bytes()
    return max(at for at in range(4096, end, 4096) if data[at : at + 4] == b"FBAT")


def damage(data: Path, case: str) -> str:
    """Damage the directory as `case` says; returns the name the refusal must give."""
    import json
    import shutil

    from fusee_server import _native

    if case == "both checkpoints deleted":
        for checkpoint in (data / "shard-000").glob("checkpoint-*"):
            checkpoint.unlink()
        return "shard-000"
    if case == "shard folder deleted":
        shutil.rmtree(data / "shard-001")
        return "shard-001"
    if case == "oldest segment deleted":
        oldest = segments(data)[0]
        oldest.unlink()
        return oldest.name
    if case == "oldest segment header zeroed":
        oldest = segments(data)[0]
        with open(oldest, "r+b") as f:
            f.write(bytes(4096))
        return oldest.name
    if case == "newest segment deleted":
        newest = segments(data)[-1]
        newest.unlink()
        return newest.name
    if case == "last batch flipped":
        report = json.loads(_native.inspect(str(data)))
        newest = segments(data)[-1]
        flip(newest, last_batch(newest, report["log"]["end_offset"]) + 100)
        return newest.name
    if case == "wal deleted":
        shutil.rmtree(data / "wal")
        return "wal/"
    if case == "meta deleted":
        (data / "fusee.meta").unlink()
        return "fusee.meta"
    if case == "meta shard count changed":
        meta = data / "fusee.meta"
        meta.write_text(meta.read_text().replace("shards=2", "shards=3"))
        return "fusee.meta"
    if case == "meta garbage":
        (data / "fusee.meta").write_bytes(b"\x00garbage\xff")
        return "fusee.meta"
    if case == "referenced run frame flipped":
        flip(data / "shard-000" / "runs-1.dat", 20)
        return "runs-1.dat"
    raise AssertionError(case)


DAMAGE = {
    "both checkpoints deleted": False,
    "shard folder deleted": False,
    "oldest segment deleted": True,
    "oldest segment header zeroed": True,
    "newest segment deleted": True,
    "last batch flipped": True,
    "wal deleted": True,
    "meta deleted": False,
    "meta shard count changed": False,
    "meta garbage": False,
    "referenced run frame flipped": False,
}


@pytest.mark.parametrize("case", DAMAGE)
async def test_damage_that_loses_acknowledged_records_refuses_naming_the_file(
    tmp_path: Path, case: str
) -> None:
    """Each of these opened, silently without acknowledged records (or a run frame
    damaged, found only when the run was loaded)."""
    data = tmp_path / "data"
    await written_dir(data, crash=DAMAGE[case])
    name = damage(data, case)
    for _ in range(2):  # a refused open releases the directory: the next gets the same answer
        with pytest.raises(fusee.FuseeError) as refused:
            await fusee.Engine.open(str(data), workflows=[napper, stepper, holder])
        assert name in str(refused.value), refused.value
        assert isinstance(refused.value, fusee.IoError | fusee.RejectedError)


async def test_more_shards_than_a_segment_header_holds_are_refused_at_creation(tmp_path: Path) -> None:
    from fusee_server import _native

    with pytest.raises(fusee.RejectedError, match=f"between 1 and {_native.SHARDS_MAX} shards"):
        await fusee.Engine.open(str(tmp_path / "data"), shards=_native.SHARDS_MAX + 1)
    assert not (tmp_path / "data" / "fusee.meta").exists()


async def test_a_shard_closed_during_its_checkpoint_still_gets_the_second_copy(tmp_path: Path) -> None:
    """A close that came while a checkpoint was being written saw no checkpoint yet and
    skipped the second copy: the log under it could not be retired at the close."""
    from fusee_server.store import LocalStorage

    storage = await LocalStorage.open(tmp_path / "data", 1)
    store, reports = await open_store(storage, 0)
    for i in range(5):
        store.append(b"record %d" % i)
    assert await reports.flush(store) == 5
    writing = asyncio.ensure_future(store.checkpoint(5, b"state"))
    await asyncio.sleep(0)  # under way, not finished
    await store.close()
    await writing
    assert store.files.checkpoint_positions() == [5, 5]
    await storage.close()
    live = sorted(
        p.name for p in (tmp_path / "data" / "wal").glob("*.wal") if not p.name.startswith("spare-")
    )
    assert live == [f"{2:016x}.wal"], "the log moved to an empty segment"


def open_files() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return out


async def test_a_closed_or_abandoned_directory_holds_no_file_even_while_its_engine_lives(
    tmp_path: Path,
) -> None:
    """The engine's objects refer to each other in cycles: a close (or a crash's abandon)
    lets go of every file at once, not when a collection finds the engine."""
    kept: list[object] = []
    for n in range(3):
        data = tmp_path / f"data-{n}"
        engine = await fusee.Engine.open(str(data), workflows=[napper], shards=2)
        await engine.start(napper, "n-1", 1)
        kept.append(engine)  # still referenced: only the close may release the files
        if n == 2:
            engine.abandon()
            await engine.storage.abandon()  # type: ignore[attr-defined]
        else:
            await engine.close()
        held = [f for f in open_files() if str(data) in f]
        assert held == [], held
