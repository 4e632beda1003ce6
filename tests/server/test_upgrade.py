"""`fusee upgrade`, run as the real command on directories earlier releases wrote (kept
in tests/server/formats/, one per format ever shipped, each with a killed process's
records past its checkpoints): this release refuses each naming the command, and after it
every run is there in its state and goes on."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fusee_server import upgrade as upgrade_module

import fusee
from tests.server.formats.checks import check_runs, power_cut_after

FORMATS = Path(__file__).parent / "formats"
# Per fixture: the release's formats (directory, log) and its shard count.
WRITTEN = {"log3.tar.gz": (1, 3, 3)}
FINISHED = range(9)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def unpack(fixture: str, into: Path) -> Path:
    with tarfile.open(FORMATS / fixture) as archive:
        archive.extractall(into, filter="data")
    return into


def digest(root: Path) -> dict[str, str]:
    """Every file's bytes (the lock's aside): what a refusal must leave as it was."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != "fusee.lock"
    }


@pytest.fixture(params=sorted(WRITTEN))
def old(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, int]:
    fixture: str = request.param
    return unpack(fixture, tmp_path / "data"), WRITTEN[fixture][2]


def test_this_release_refuses_it_naming_the_command(old: tuple[Path, int]) -> None:
    root, _ = old
    before = digest(root)

    async def go() -> None:
        await fusee.Engine.open(str(root))

    with pytest.raises(fusee.RejectedError, match=r"written by an earlier release.*fusee upgrade <dir>"):
        asyncio.run(go())
    inspected = cli("inspect", root)
    assert inspected.returncode == 1 and "fusee upgrade" in inspected.stdout
    assert digest(root) == before


def test_upgrade_keeps_every_run_and_they_go_on(old: tuple[Path, int]) -> None:
    root, shards = old
    done = cli("upgrade", root)
    assert done.returncode == 0, done.stderr
    assert f"converted directory format 1 to 2 ({shards} shards)" in done.stdout
    assert sorted(os.listdir(root)) == [
        "fusee.lock",
        "fusee.meta",
        *[f"shard-00{i}" for i in range(shards)],
        "wal",
    ]
    assert cli("inspect", root).returncode == 0
    again = cli("upgrade", root)
    assert again.returncode == 0 and "nothing to convert" in again.stdout
    asyncio.run(check_runs(root, finished=FINISHED, shards=shards))
    # The release's other tool works on the converted directory.
    assert cli("reshard", root, "--shards", "5").returncode == 0


def test_a_crash_at_every_step_is_finished_by_running_again(old: tuple[Path, int], tmp_path: Path) -> None:
    written, shards = old
    renames = 2 * (shards + 1)  # each old folder (the shards' and the log) out, its new one in
    for crash_after in range(renames):
        root = tmp_path / f"crash-{crash_after}"
        shutil.copytree(written, root)
        with pytest.raises(OSError, match="power"), power_cut_after(crash_after):
            upgrade_module.upgrade(root)
        again = cli("upgrade", root)
        assert again.returncode == 0, again.stderr
        assert not (root / "upgrade.old").exists() and not (root / "upgrade.new").exists()
        asyncio.run(check_runs(root, finished=FINISHED, shards=shards))


def test_a_damaged_frame_is_refused_and_nothing_changes(old: tuple[Path, int]) -> None:
    root, _ = old
    store = root / "shard-001" / "runs-1.dat"
    data = bytearray(store.read_bytes())
    data[20] ^= 0x40  # inside the first frame, which the checkpoint references
    store.write_bytes(bytes(data))
    before = digest(root)
    done = cli("upgrade", root)
    assert done.returncode == 2
    assert "shard-001/runs-1.dat: the frame at offset 0 is damaged" in done.stderr
    assert digest(root) == before


def test_a_damaged_batch_is_refused_and_nothing_changes(old: tuple[Path, int]) -> None:
    root, _ = old
    (segment,) = [p for p in (root / "wal").iterdir() if not p.name.startswith("spare-")]
    data = bytearray(segment.read_bytes())
    data[4096 + 100] ^= 0x01  # the first batch after the header: acknowledged, as later ones prove
    segment.write_bytes(bytes(data))
    before = digest(root)
    done = cli("upgrade", root)
    assert done.returncode == 2
    assert "was acknowledged but is damaged or lost" in done.stderr
    assert digest(root) == before


def test_a_directory_open_elsewhere_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "current"

    async def go() -> subprocess.CompletedProcess[str]:
        async with await fusee.Engine.open(str(root), shards=2):
            return await asyncio.to_thread(cli, "upgrade", root)

    done = asyncio.run(go())
    assert done.returncode == 2 and "open in process" in done.stderr


def test_the_current_format_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "current"

    async def make() -> None:
        async with await fusee.Engine.open(str(root), shards=2):
            pass

    asyncio.run(make())
    before = digest(root)
    done = cli("upgrade", root)
    assert done.returncode == 0 and "current format (2): nothing to convert" in done.stdout
    assert digest(root) == before
