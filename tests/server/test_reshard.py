"""`fusee reshard`, run as the real command on directories this release wrote, one of them
left by a killed process: every run is kept in its state and goes on under the new count,
a crash at every step of the swap is finished by running the command again, and what it
must refuse it refuses with nothing changed."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from fusee_server import reshard as reshard_module
from fusee_server import swap

import fusee
from tests.server.formats.checks import check_runs, power_cut_after
from tests.server.formats.flows import WORKFLOWS

MAKE = Path(__file__).parent / "formats" / "make.py"
FINISHED = range(9)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four shards: runs of every kind, then a process killed with records past the checkpoints."""
    root = tmp_path_factory.mktemp("written") / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MAKE.parent), *sys.path])}
    subprocess.run([sys.executable, str(MAKE), str(root), "4"], check=True, env=env, timeout=60)
    return root


@pytest.fixture
def data(written: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(written, copy)
    return copy


def listing(root: Path, shards: int | None = None) -> set[tuple[str, int, str, str]]:
    async def go() -> set[tuple[str, int, str, str]]:
        async with await fusee.Engine.open(str(root), workflows=WORKFLOWS, shards=shards) as engine:
            runs = set()
            async for run in engine.list():
                assert run.shard == zlib.crc32(run.id.encode()) % engine.shard_count
                runs.add((run.id, run.run, run.type, str(run.status)))
            return runs

    return asyncio.run(go())


def test_grow_then_shrink_keeps_every_run_in_its_state(data: Path) -> None:
    before = listing(data)
    grown = cli("reshard", data, "--shards", "8")
    assert grown.returncode == 0, grown.stderr
    assert "resharded 4 -> 8 shards: 22 runs" in grown.stdout
    assert listing(data, 8) == before
    shrunk = cli("reshard", data, "--shards", "3")
    assert shrunk.returncode == 0, shrunk.stderr
    assert "resharded 8 -> 3 shards" in shrunk.stdout
    assert sorted(os.listdir(data)) == [
        "fusee.lock",
        "fusee.meta",
        "shard-000",
        "shard-001",
        "shard-002",
        "wal",
    ]
    # And every run goes on: timers fire, signals finish the waiters, results read back.
    placed = asyncio.run(check_runs(data, finished=FINISHED, shards=3))
    assert placed == [zlib.crc32(f"finished-{n}".encode()) % 3 for n in FINISHED]


def test_opening_with_another_count_names_the_command(data: Path) -> None:
    async def go() -> None:
        await fusee.Engine.open(str(data), shards=8)

    with pytest.raises(fusee.RejectedError, match=r"fusee reshard <dir> --shards 8"):
        asyncio.run(go())


def test_the_same_count_changes_nothing(data: Path) -> None:
    before = listing(data)
    done = cli("reshard", data, "--shards", "4")
    assert done.returncode == 0, done.stderr
    assert "the directory has 4 shards: nothing to change" in done.stdout
    assert listing(data, 4) == before


@pytest.mark.parametrize("count", ["0", "257"])
def test_a_count_no_directory_can_have_is_refused(data: Path, count: str) -> None:
    done = cli("reshard", data, "--shards", count)
    assert done.returncode == 2
    assert "between 1 and 256 shards" in done.stderr
    assert (data / "shard-003").is_dir() and not (data / "reshard.new").exists()


def test_a_directory_open_elsewhere_is_refused_and_untouched(data: Path) -> None:
    async def go() -> subprocess.CompletedProcess[str]:
        async with await fusee.Engine.open(str(data), workflows=WORKFLOWS):
            return await asyncio.to_thread(cli, "reshard", data, "--shards", "2")

    done = asyncio.run(go())
    assert done.returncode == 2
    assert f"open in process {os.getpid()}" in done.stderr
    assert sorted(n for n in os.listdir(data) if n.startswith("shard-")) == [f"shard-00{i}" for i in range(4)]
    asyncio.run(check_runs(data, finished=FINISHED, shards=4))


def test_not_a_directory_or_a_missing_one(tmp_path: Path) -> None:
    assert "does not exist" in cli("reshard", tmp_path / "nope", "--shards", "2").stderr
    (tmp_path / "empty").mkdir()
    done = cli("reshard", tmp_path / "empty", "--shards", "2")
    assert done.returncode == 2 and "not a Fusee data directory" in done.stderr
    assert os.listdir(tmp_path / "empty") == []


def test_a_build_a_crash_cut_short_is_thrown_away(data: Path) -> None:
    (data / "reshard.new" / "shard-000").mkdir(parents=True)
    (data / "reshard.new" / "shard-000" / "runs-1.dat").write_bytes(b"half a copy")
    assert len(listing(data)) == 22  # the directory opens as before, with its old count
    assert cli("reshard", data, "--shards", "2").returncode == 0
    assert not (data / "reshard.new").exists()
    asyncio.run(check_runs(data, finished=FINISHED, shards=2))


def test_a_crash_at_every_step_of_the_swap_is_finished_by_running_again(
    written: Path, tmp_path: Path
) -> None:
    # Renames in the swap: 4 old folders and the log out, 2 new folders and the log in,
    # 2 old shards a shrink drops out; then the final meta. A crash after each of them.
    steps = 0
    for crash_after in range(20):
        root = tmp_path / f"data-{crash_after}"
        shutil.copytree(written, root)
        try:
            with power_cut_after(crash_after):
                reshard_module.reshard(root, 2)
            finished = True
        except OSError:
            finished = False
        if finished:
            steps = crash_after
            break
        if swap.swapping(root) is not None:

            async def refused(root: Path = root) -> None:
                await fusee.Engine.open(str(root))

            with pytest.raises(fusee.RejectedError, match="run `fusee reshard <dir>` again"):
                asyncio.run(refused())
        again = cli("reshard", root, "--shards", "2")
        assert again.returncode == 0, again.stderr
        assert not (root / "reshard.old").exists() and not (root / "reshard.new").exists()
        asyncio.run(check_runs(root, finished=FINISHED, shards=2))
    assert steps >= 7  # every rename was crashed after, and the last run went through
