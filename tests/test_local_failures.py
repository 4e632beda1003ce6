"""Local mode refuses what it cannot do safely: a second process on a directory, another
shard count, and any acknowledgment after a failed flush."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusee

ROOT = Path(__file__).resolve().parent.parent


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
    import os

    assert f"open in process {os.getpid()}" in child.stdout, child.stdout + child.stderr


async def test_another_shard_count_is_refused_naming_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with await fusee.Engine.open(str(data), workflows=[napper], shards=2) as engine:
        await engine.start(napper, "n-1", 1)
    with pytest.raises(fusee.RejectedError) as refused:
        await fusee.Engine.open(str(data), workflows=[napper], shards=3)
    assert "shards=2" in str(refused.value) and "reshard" in str(refused.value)
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

    import asyncio

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
