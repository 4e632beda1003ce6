"""The `fusee` command, run as a real process against directories the real engine wrote:
one closed cleanly, one whose process was killed, and one with a damaged batch."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fusee

SHARDS = 2
RUNS = 6


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def inspect_json(data: Path) -> tuple[int, dict[str, Any]]:
    done = cli("inspect", data, "--json")
    return done.returncode, json.loads(done.stdout)


@fusee.workflow("add-one")
async def add_one(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("add", lambda: n + 1)


@pytest.fixture
async def closed_dir(tmp_path: Path) -> tuple[Path, list[int]]:
    """A directory closed cleanly, and each shard's log position at the close."""
    data = tmp_path / "data"
    async with await fusee.Engine.open(str(data), workflows=[add_one], shards=SHARDS) as engine:
        runs = [await engine.start(add_one, f"r-{i}", i) for i in range(RUNS)]
        assert [await run.result() for run in runs] == [i + 1 for i in range(RUNS)]
        log = engine.storage.log  # type: ignore[attr-defined]
    return data, [log.appended(shard) for shard in range(SHARDS)]


# The child runs its workflows until every record is durable, reports each shard's durable
# position, and waits to be killed: the directory keeps its log and gets no closing checkpoint.
CHILD = f"""
import asyncio, json, sys
import fusee

@fusee.workflow("add-one")
async def add_one(ctx, n):
    return await ctx.step("add", lambda: n + 1)

async def main():
    engine = await fusee.Engine.open(sys.argv[1], workflows=[add_one], shards={SHARDS})
    for i in range({RUNS}):
        run = await engine.start(add_one, f"r-{{i}}", i)
        await run.result()
    log = engine.storage.log
    while any(log.durable(s) < log.appended(s) for s in range({SHARDS})):
        await asyncio.sleep(0.001)
    print(json.dumps([log.durable(s) for s in range({SHARDS})]), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
async def killed_dir(tmp_path: Path) -> tuple[Path, list[int]]:
    """A directory whose process was SIGKILLed, and each shard's durable position then."""
    data = tmp_path / "killed"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(data), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 20)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    return data, json.loads(line)


def segment_one(data: Path) -> Path:
    return data / "wal" / "0000000000000001.wal"


async def test_inspect_after_a_clean_close_lists_two_intact_checkpoints_per_shard(
    closed_dir: tuple[Path, list[int]],
) -> None:
    data, positions = closed_dir
    assert sum(positions) > 0
    code, report = inspect_json(data)
    assert code == 0
    assert report["shards"] == SHARDS
    assert report["log"]["error"] is None
    # Every record is covered by two checkpoints, so the log moved to an empty segment.
    assert report["log"]["batches"] == 0
    assert report["log"]["records_per_shard"] == [0] * SHARDS
    assert report["log"]["spares"] >= 1
    for shard, entry in enumerate(report["checkpoints"]):
        assert entry["shard"] == shard
        files = entry["files"]
        assert len(files) == 2, files
        assert all(f["intact"] for f in files)
        assert {f["position"] for f in files} == {positions[shard]}

    done = cli("inspect", data)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"{data}: {SHARDS} shards" in text
    assert "chain: 0 batches" in text
    assert "shard 000" in text and "shard 001" in text
    assert text.count("  intact") == 2 * SHARDS
    for shard, position in enumerate(positions):
        section = text.split(f"shard {shard:03d}\n")[1].split("  shard ")[0]
        assert section.count(f"position {position}  ") == 2, section
        assert f"checkpoint-{position:016x}.fck" in section


async def test_inspect_after_a_kill_counts_every_durable_record(killed_dir: tuple[Path, list[int]]) -> None:
    data, durable = killed_dir
    code, report = inspect_json(data)
    assert code == 0
    log = report["log"]
    assert log["error"] is None
    assert log["batches"] > 0
    # Nothing was checkpointed, so the log holds every record from position 1 on.
    assert log["records_per_shard"] == durable
    assert sum(durable) > 0
    (segment,) = log["segments"]
    assert segment["file"] == segment_one(data).name
    assert segment["in_chain"] and not segment["torn_tail"]
    assert segment["records_per_shard"] == durable
    assert (segment["first_seq"], segment["last_seq"]) == (1, log["batches"])
    assert log["next_seq"] == log["batches"] + 1
    assert all(entry["files"] == [] for entry in report["checkpoints"])

    done = cli("inspect", data)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"batches 1..{log['batches']} ({log['batches']})" in text
    assert "in chain" in text
    assert "records per shard: " + " ".join(f"{s}:{n}" for s, n in enumerate(durable)) in text
    assert f"chain: {log['batches']} batches, next batch seq {log['batches'] + 1}" in text
    assert text.count("none") == SHARDS  # no checkpoint in any shard


async def test_inspect_reports_damage_to_an_acknowledged_batch_and_exits_1(
    killed_dir: tuple[Path, list[int]],
) -> None:
    data, _ = killed_dir
    assert inspect_json(data)[1]["log"]["batches"] >= 3  # later batches prove batch 1 was acknowledged
    with open(segment_one(data), "r+b") as f:
        f.seek(4096 + 70)  # inside batch 1, past its 64-byte header
        byte = f.read(1)[0]
        f.seek(4096 + 70)
        f.write(bytes([byte ^ 0xFF]))

    done = cli("inspect", data)
    assert done.returncode == 1
    assert "DAMAGED" in done.stdout
    assert "log batch 1 " in done.stdout
    assert "acknowledged" in done.stdout
    code, report = inspect_json(data)
    assert code == 1
    assert "log batch 1 " in report["log"]["error"]
    assert len(report["checkpoints"]) == SHARDS  # the shards are still listed

    # The engine agrees: it refuses to open the directory.
    with pytest.raises(fusee.IoError, match="log batch 1 "):
        await fusee.Engine.open(str(data), workflows=[add_one])


def test_inspect_of_something_else_than_a_data_directory_exits_2(tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (plain, empty, tmp_path / "missing"):
        done = cli("inspect", path)
        assert done.returncode == 2
        assert done.stdout == ""
        assert str(path) in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_disk_check_reports_a_latency_distribution(tmp_path: Path) -> None:
    done = cli("disk-check", tmp_path, "0.2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["count"] > 0
    assert 0 < figures["p50_us"] <= figures["p90_us"] <= figures["p99_us"] <= figures["max_us"]
    assert 0 < figures["mean_us"] <= figures["max_us"]
    assert isinstance(figures["direct"], bool)
    assert os.listdir(tmp_path) == []  # the scratch file is gone

    done = cli("disk-check", tmp_path, "0.1")
    assert done.returncode == 0, done.stderr
    for name in ("mean", "p50", "p90", "p99", "max"):
        assert f"  {name} " in done.stdout
    assert ("O_DIRECT" in done.stdout) or ("buffered" in done.stdout)

    done = cli("disk-check", tmp_path / "missing", "0.1")
    assert done.returncode == 2
    assert str(tmp_path / "missing") in done.stderr
    assert not (tmp_path / "missing").exists()


def test_version_and_help() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"fusee {fusee.__version__}"
    done = cli()
    assert done.returncode == 0
    assert "inspect" in done.stdout and "disk-check" in done.stdout
    assert shutil.which("fusee", path=str(Path(sys.executable).parent))  # the installed script


# Runs the CLI in a process where the fusee-server distribution cannot be imported.
WITHOUT_SERVER = """
import sys
sys.modules["fusee_server"] = None  # makes `import fusee_server` raise ImportError
from fusee._cli import main
assert "fusee_server" not in [m for m, v in sys.modules.items() if v is not None]
raise SystemExit(main(sys.argv[1:]))
"""


def test_without_fusee_server_the_commands_say_how_to_install_it(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WITHOUT_SERVER, *args], capture_output=True, text=True, timeout=30
        )

    done = run("--version")
    assert done.returncode == 0 and "fusee" in done.stdout
    (tmp_path / "fusee.meta").write_text("not read: the import fails first")
    for args in (["inspect", str(tmp_path)], ["disk-check", str(tmp_path), "0.1"]):
        done = run(*args)
        assert done.returncode == 2, done.stderr
        assert "pip install ./server" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "fusee.meta").read_text() == "not read: the import fails first"
