"""Continuous backup of a local-mode directory (`Engine.open(dir, backup=...)`) to a
directory target: a killed process's backup restores every start acknowledged long enough
before the kill; a segment the backup lacks is never retired, however long the target
fails; retention drops old points and what only they needed; a restored directory backed
up again is a new timeline; one target takes one writer; and every refusal is named."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fusee_server.backup import manifest as M
from fusee_server.backup.continuous import Options
from fusee_server.backup.restore import restore
from fusee_server.backup.targets import LocalTarget
from fusee_server.store import LocalStorage

import fusee
from tests.server.formats.flows import WORKFLOWS, finished

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)], capture_output=True, text=True, timeout=60
    )


# Starts `finished` runs until killed, printing each acknowledged start's ID and time.
CHILD = """
import asyncio, sys, time
import fusee
from tests.server.formats.flows import WORKFLOWS, finished

async def main():
    engine = await fusee.Engine.open(sys.argv[1], workflows=WORKFLOWS, shards=3, backup=sys.argv[2])
    n = 0
    while True:
        await (await engine.start(finished, f"finished-{n}", n)).result()
        print(f"acked finished-{n} {time.time()}", flush=True)
        n += 1

asyncio.run(main())
"""


def test_a_killed_process_loses_at_most_the_last_upload(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), str(target)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    acked: dict[str, float] = {}
    assert child.stdout is not None
    began = time.time()
    for line in child.stdout:
        _, wid, at = line.split()
        acked[wid] = float(at)
        if time.time() - began > 4.0:
            break
    child.send_signal(signal.SIGKILL)
    killed = time.time()
    child.wait()
    child.stdout.close()
    restored = tmp_path / "restored"
    assert cli("restore", target, restored).returncode == 0

    async def read() -> dict[str, Any]:
        async with await fusee.Engine.open(str(restored), workflows=WORKFLOWS) as engine:
            return {r.id: await engine.run(r.id).result() async for r in engine.list(type="finished")}

    runs = asyncio.run(read())
    for wid, at in acked.items():
        if at < killed - 2.5:  # one upload interval and one upload
            assert runs.get(wid) == int(wid.split("-")[1]) * 2 + 1, wid


async def test_a_segment_the_backup_lacks_is_never_retired(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    target.write_text("a file, not a directory: every upload fails")
    with pytest.raises(fusee.FuseeError):
        await LocalStorage.open(data, 2, backup=str(target))  # refused before anything is written
    assert not data.exists()
    target.unlink()
    target.mkdir()
    storage = await LocalStorage.open(
        data, 2, segment_bytes_min=16 << 10, segment_bytes_max=32 << 10, backup=str(target)
    )
    backup = storage.backup
    assert backup is not None
    backup.options.upload_interval_s = 0.1
    engine = await fusee.Engine.open(storage=storage, workflows=WORKFLOWS)
    try:
        await (await engine.start(finished, "before", 1)).result()
        await asyncio.sleep(0.5)
        # The target goes away: its directory replaced by a file.
        os.rename(target, tmp_path / "away")
        target.write_text("gone")
        # Runs until both retained checkpoints of a shard pass what the backup holds:
        # from then on, only the hold keeps the segments the backup lacks.
        n, deadline = 0, time.monotonic() + 30
        while True:
            await (await engine.start(finished, f"during-{n}", n)).result()
            n += 1
            covered = [storage.stores[i].files.covered() for i in range(2)]
            if n >= 200 and any(c > u for c, u in zip(covered, backup.uploaded, strict=True)):
                break
            assert time.monotonic() < deadline, (covered, backup.uploaded)
        assert backup.status()["failing"]
        assert len(storage.log.segment_ids()) > 2, "the log never rolled: the test shows nothing"
        for shard, uploaded in enumerate(backup.uploaded):
            # Still in the log: the first record the backup lacks (retired, this raises).
            assert storage.log.read_records(shard, uploaded, 1), shard
        target.unlink()
        os.rename(tmp_path / "away", target)
        deadline = time.monotonic() + 20
        while backup.status()["failing"] or backup.status()["lag_s"] > 0:
            assert time.monotonic() < deadline, backup.status()
            await asyncio.sleep(0.1)
    finally:
        await engine.close()
    # Caught up, the segments went at the close, and every run is in the backup.
    restored = tmp_path / "restored"
    restore(LocalTarget(target), restored)
    async with await fusee.Engine.open(str(restored), workflows=WORKFLOWS) as engine:
        for i in range(n):
            assert await engine.run(f"during-{i}").result() == i * 2 + 1


async def test_retention_drops_old_points_and_only_what_they_needed(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    storage = await LocalStorage.open(data, 1, backup=str(target), backup_options=Options(0.05, 0.05, 1.0))
    engine = await fusee.Engine.open(storage=storage, workflows=WORKFLOWS)
    try:
        for n in range(30):
            await (await engine.start(finished, f"r-{n}", n)).result()
            await asyncio.sleep(0.1)
    finally:
        await engine.close()
    manifest = M.load(LocalTarget(target))
    assert manifest is not None
    (timeline,) = manifest.timelines
    oldest = timeline.points[0].at_ms
    assert time.time() * 1000 - oldest < 2500, "points older than the retention were kept"
    named = {o.name for o in timeline.objects()}
    stored = set(LocalTarget(target).names()) - {"manifest.json"}
    assert stored == named, "objects the manifest no longer names were left, or named ones deleted"
    assert cli("backups", target, "--verify").returncode == 0
    oldest_dir = tmp_path / "oldest"
    assert cli("restore", target, oldest_dir, "--at", str(oldest)).returncode == 0


async def test_a_restored_directory_backed_up_again_is_a_new_timeline(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    async with await fusee.Engine.open(
        str(data), workflows=WORKFLOWS, shards=2, backup=str(target)
    ) as engine:
        await (await engine.start(finished, "first", 1)).result()
    restored = tmp_path / "restored"
    assert cli("restore", target, restored).returncode == 0
    async with await fusee.Engine.open(str(restored), workflows=WORKFLOWS, backup=str(target)) as engine:
        await (await engine.start(finished, "second", 2)).result()
    listing = json.loads(cli("backups", target, "--json").stdout)
    timelines = {p["timeline"] for p in listing["points"]}
    assert len(timelines) == 2
    older = listing["points"][0]["timeline"]
    only_first = tmp_path / "only-first"
    assert cli("restore", target, only_first, "--timeline", older).returncode == 0
    async with await fusee.Engine.open(str(only_first), workflows=WORKFLOWS) as engine:
        assert await engine.run("first").result() == 3
        with pytest.raises(fusee.NotFoundError):
            await engine.run("second").status()
    # The data directory itself continues its own timeline across reopenings.
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS, backup=str(target)) as engine:
        await (await engine.start(finished, "third", 3)).result()
    assert len({p["timeline"] for p in json.loads(cli("backups", target, "--json").stdout)["points"]}) == 2


async def test_a_second_writer_and_another_shard_count_stop_the_backup(tmp_path: Path) -> None:
    target = tmp_path / "target"
    async with await fusee.Engine.open(
        str(tmp_path / "a"), workflows=WORKFLOWS, shards=2, backup=str(target)
    ):
        async with await fusee.Engine.open(str(tmp_path / "b"), shards=2, backup=str(target)) as second:
            await asyncio.sleep(2.5)
            backup = second.storage.backup  # type: ignore[attr-defined]
            first_error = backup.status()["error"]
        # One of the two found the other's manifest and stopped, naming why.
    assert first_error is None or "one directory writes to a target at a time" in first_error
    async with await fusee.Engine.open(str(tmp_path / "c"), shards=3, backup=str(target)) as third:
        await asyncio.sleep(1.0)
        status = third.storage.backup.status()  # type: ignore[attr-defined]
    assert "give a resharded directory a new target" in status["error"]


def test_restore_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    empty = tmp_path / "empty-target"
    empty.mkdir()
    assert "no backup there" in cli("restore", empty, tmp_path / "x").stderr
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("mine")
    assert "exists and is not empty" in cli("restore", empty, taken).stderr
    assert "expected RFC 3339" in cli("restore", empty, tmp_path / "y", "--at", "yesterday").stderr
    assert (taken / "file").read_text() == "mine"


async def test_a_fresh_backup_of_a_directory_with_history(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS, shards=2) as engine:
        for n in range(9):
            await (await engine.start(finished, f"finished-{n}", n)).result()
    done = cli("backup", data, target)
    assert done.returncode == 0, done.stderr
    restored = tmp_path / "restored"
    assert cli("restore", target, restored).returncode == 0
    async with await fusee.Engine.open(str(restored), workflows=WORKFLOWS) as engine:
        assert [await engine.run(f"finished-{n}").result() for n in range(9)] == [n * 2 + 1 for n in range(9)]


def test_doctor_reports_the_backup(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"

    async def make() -> None:
        async with await fusee.Engine.open(
            str(data), workflows=WORKFLOWS, shards=2, backup=str(target)
        ) as engine:
            await (await engine.start(finished, "one", 1)).result()

    asyncio.run(make())
    checks = json.loads(cli("doctor", data, "--json", "--seconds", "0.2").stdout)["checks"]
    assert checks["backup"]["verdict"] == "OK", checks["backup"]
    assert "newest restore point" in checks["backup"]["summary"]
    # The target damaged: the manifest no longer decodes, and the doctor fails it.
    (target / "manifest.json").write_text("{not json")
    checks = json.loads(cli("doctor", data, "--json", "--seconds", "0.2").stdout)["checks"]
    assert checks["backup"]["verdict"] == "FAIL" and "does not decode" in checks["backup"]["summary"]


async def test_a_mutated_manifest_or_object_is_refused_by_name(tmp_path: Path) -> None:
    """The target is an input we do not own: random damage to its manifest or its
    objects makes restore and verify refuse with a FuseeError, never another error and
    never a directory built from wrong bytes."""
    import random

    data, target = tmp_path / "data", tmp_path / "target"
    async with await fusee.Engine.open(
        str(data), workflows=WORKFLOWS, shards=2, backup=str(target)
    ) as engine:
        for n in range(5):
            await (await engine.start(finished, f"r-{n}", n)).result()
    pristine = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    draw = random.Random(int(os.environ.get("FUSEE_FUZZ_SEED", "7")))
    for attempt in range(150):
        victim = draw.choice(sorted(pristine))
        data_bytes = bytearray(pristine[victim])
        for _ in range(draw.randint(1, 4)):
            at = draw.randrange(len(data_bytes))
            data_bytes[at] = draw.randrange(256) if draw.random() < 0.8 else data_bytes[at] ^ 1
        if draw.random() < 0.2:
            data_bytes = data_bytes[: draw.randrange(len(data_bytes) + 1)]
        victim.write_bytes(bytes(data_bytes))
        out = tmp_path / f"restored-{attempt}"
        try:
            restore(LocalTarget(target), out)
        except fusee.FuseeError:
            assert not out.exists(), "a refused restore left a directory"
        else:
            # The damage fell where nothing reads it (JSON whitespace, a dropped point):
            # what was restored must then be right.
            async with await fusee.Engine.open(str(out), workflows=WORKFLOWS) as restored:
                async for run in restored.list(type="finished"):
                    n = int(run.id.split("-")[1])
                    assert await restored.run(run.id).result() == n * 2 + 1
        victim.write_bytes(pristine[victim])
