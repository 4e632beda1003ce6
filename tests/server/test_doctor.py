"""The scrub of a batch's padding (the stamped sectors of zeros after its records, which
recovery does not read) and `fusee doctor`: damage there opens with every run intact,
and the open, `fusee inspect` and `fusee doctor` each name the sector by segment file
and offset. Directories are written by the real engine, then its process "crashes"
(nothing more is written), so the log keeps its batches."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fusee

SHARDS = 2
RUNS = 6
SECTOR, PAYLOAD, BLOCK = 512, 504, 4096
CHECKS = ("opens", "scrub", "space", "backup", "disk")


@fusee.workflow("add-one")
async def add_one(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("add", lambda: n + 1)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def doctor_json(data: Path) -> tuple[int, dict[str, Any]]:
    done = cli("doctor", data, "--json", "--seconds", "0.1")
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
async def crashed_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    engine = await fusee.Engine.open(str(data), workflows=[add_one], shards=SHARDS)
    for i in range(RUNS):
        assert await (await engine.start(add_one, f"r-{i}", i)).result() == i + 1
    engine.abandon()
    await engine.storage.abandon()  # type: ignore[attr-defined]
    return data


def padding_sectors(data: Path) -> list[tuple[Path, int, int]]:
    """(segment, offset, batch seq) of every padding sector of every batch in the live
    segments: from the sector after a batch's records to its 4 KiB boundary."""
    found = []
    for segment in sorted((data / "wal").glob("0*.wal")):
        bytes_ = segment.read_bytes()
        at = BLOCK
        while bytes_[at : at + 4] == b"FBAT":
            length, seq = struct.unpack_from("<IQ", bytes_, at + 4)
            records = -(-length // PAYLOAD)
            end = at + -(-records * SECTOR // BLOCK) * BLOCK
            found += [(segment, s, seq) for s in range(at + records * SECTOR, end, SECTOR)]
            at = end
    return found


def flip(path: Path, at: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


async def assert_every_run_reads_back(data: Path) -> None:
    async with await fusee.Engine.open(str(data), workflows=[add_one]) as engine:
        assert [await engine.run(f"r-{i}").result() for i in range(RUNS)] == [i + 1 for i in range(RUNS)]


async def test_a_damaged_padding_sector_opens_and_is_named_by_the_open_inspect_and_doctor(
    crashed_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = crashed_dir
    pads = padding_sectors(data)
    assert len(pads) > RUNS, "every batch of a few records leaves padding"
    segment, sector, seq = pads[len(pads) // 2]
    flip(segment, sector + 100)
    name = segment.name

    done = cli("inspect", data)
    assert done.returncode == 0, done.stdout + done.stderr  # it opens: a WARNING, no refusal
    warning = f"WARNING: wal/{name} offset {sector}: a padding sector of log batch {seq} is damaged"
    assert warning in done.stdout
    assert "DAMAGED" not in done.stdout
    report = json.loads(cli("inspect", data, "--json").stdout)
    assert report["error"] is None
    (damaged,) = report["scrub"]["damaged"]
    assert (damaged["file"], damaged["offset"], damaged["seq"], damaged["padding"]) == (
        name,
        sector,
        seq,
        True,
    )

    done = cli("doctor", data, "--seconds", "0.1")
    assert done.returncode == 1, done.stdout + done.stderr
    (scrub,) = [line for line in done.stdout.splitlines() if line.strip().startswith("FAIL  scrub")]
    assert "1 damaged sector " in scrub
    assert f"wal/{name} offset {sector}:" in done.stdout
    code, doctor = doctor_json(data)
    assert (code, doctor["verdict"], doctor["exit"]) == (1, "FAIL", 1)
    assert doctor["checks"]["opens"]["verdict"] == "OK"
    assert doctor["checks"]["scrub"]["damaged"] == [damaged]

    # The open says it on stderr, and every acknowledged run reads back.
    capfd.readouterr()
    await assert_every_run_reads_back(data)
    err = capfd.readouterr().err
    assert f"{data / 'wal' / name} offset {sector}: a padding sector of log batch {seq} is damaged" in err
    assert "no acknowledged record is lost" in err


async def test_a_clean_directory_is_ok_but_for_what_the_machine_says(crashed_dir: Path) -> None:
    data = crashed_dir
    before = snapshot(data)
    code, doctor = doctor_json(data)
    checks = doctor["checks"]
    assert list(checks) == list(CHECKS)
    for name in ("opens", "scrub", "backup"):
        assert checks[name]["verdict"] == "OK", checks[name]
    assert checks["scrub"]["damaged"] == [] and checks["scrub"]["sectors"] > 0
    assert checks["backup"]["summary"] == "no backup configured"
    # Free space and the disk are this machine's: their verdicts follow the stated thresholds.
    space = checks["space"]
    free, total = space["free_bytes"], space["total_bytes"]
    expected = (
        "FAIL"
        if free < 64 << 20
        else "WARN"
        if free < 0.10 * total or free < 2 * space["largest_segment_bytes"]
        else "OK"
    )
    assert space["verdict"] == expected
    disk = checks["disk"]
    assert disk["count"] > 0 and isinstance(disk["direct"], bool)
    assert disk["verdict"] == ("WARN" if disk["p50_us"] < 10 else "OK")
    verdicts = {c["verdict"] for c in checks.values()}
    worst = "FAIL" if "FAIL" in verdicts else "WARN" if "WARN" in verdicts else "OK"
    assert (doctor["verdict"], code) == (worst, {"OK": 0, "WARN": 3, "FAIL": 1}[worst])

    done = cli("doctor", data, "--seconds", "0.1")
    assert done.returncode == code
    for name in CHECKS:
        (line,) = [line for line in done.stdout.splitlines() if line[8:].startswith(name + " ")]
        assert line.split()[0] == checks[name]["verdict"]
    assert snapshot(data) == before, "doctor changed the directory"
    assert not list(data.parent.glob(".fusee-doctor-*")), "the disk check's scratch folder is gone"


async def test_doctor_reads_a_directory_an_engine_has_open(tmp_path: Path) -> None:
    data = tmp_path / "open"
    async with await fusee.Engine.open(str(data), workflows=[add_one], shards=SHARDS) as engine:
        assert await (await engine.start(add_one, "r", 1)).result() == 2
        code, doctor = doctor_json(data)  # no lock taken: the engine keeps it
        assert doctor["checks"]["opens"]["verdict"] == "OK", doctor
        assert doctor["checks"]["scrub"]["verdict"] == "OK"
        assert code in (0, 3)
        assert await (await engine.start(add_one, "s", 2)).result() == 3


def test_doctor_refuses_what_is_no_data_directory(tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (plain, empty, tmp_path / "missing"):
        done = cli("doctor", path, "--seconds", "0.1")
        assert done.returncode == 2, done.stdout
        assert done.stdout == ""
        assert str(path) in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert os.listdir(empty) == [] and not (tmp_path / "missing").exists()


async def test_random_flips_in_random_padding_sectors_open_and_are_each_named(crashed_dir: Path) -> None:
    from fusee_server import _native

    pads = padding_sectors(crashed_dir)
    rng = random.Random(20240611)
    for round in range(40):
        data = crashed_dir.parent / f"fuzz-{round}"
        shutil.copytree(crashed_dir, data)
        hit = rng.sample(pads, rng.randint(1, 4))
        for segment, sector, _ in hit:
            flip(data / "wal" / segment.name, sector + rng.randrange(SECTOR), 1 << rng.randrange(8))
        report = json.loads(_native.inspect(str(data)))
        assert report["error"] is None
        named = {(d["file"], d["offset"], d["seq"]) for d in report["scrub"]["damaged"]}
        assert named == {(segment.name, sector, seq) for segment, sector, seq in hit}
        if round % 10 == 0:
            await assert_every_run_reads_back(data)
        shutil.rmtree(data)


def snapshot(data: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(data)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(data.rglob("*"))
        if p.is_file()
    }


def test_without_fusee_server_doctor_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "fusee.meta").write_text("not read: the import fails first")
    script = (
        "import sys\nsys.modules['fusee_server'] = None\nfrom fusee._cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "doctor", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert "pip install ./server" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
