"""Journal tools (docs/engine.md, *Exporting journals*): `engine.export_journal`, `fusee
export` (one run, or `--sample N`) from a data directory the application still holds,
`fusee show`, `fusee replay-check` against the code before a deploy, and `fusee versions`.
Every command runs as a real process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import fusee
from fusee.engine.replay import Replayer, read_export
from tests.support.procs import ROOT
from tests.support.waiting import eventually

V1 = """
import fusee

@fusee.workflow("order", version={version})
async def order(ctx, amount: int) -> str:
    await ctx.step("{first}", lambda: amount)
    await ctx.sleep("hold", "1h")
    return await ctx.step("ship", lambda: "shipped")
"""


def cli(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _module(tmp_path: Path, name: str, first: str, version: int = 1) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(V1.format(first=first, version=version))
    return path


def _load(path: Path):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["order"]


async def _asleep(engine: fusee.Engine, ids: list[str]) -> None:
    async def all_asleep() -> bool:
        for wid in ids:
            journal = (await engine.run(wid).describe()).journal
            if type(journal[-1]).__name__ != "TimerStarted":
                return False
        return True

    await eventually(all_asleep, timeout=20, every=0.02)


async def test_export_from_a_directory_in_use_then_replay_check_before_a_deploy(tmp_path: Path):
    data = tmp_path / "data"
    old = _module(tmp_path, "flows_old", "charge")
    changed = _module(tmp_path, "flows_new", "authorize")
    ids = [f"order/{i}" for i in range(6)]
    # The application keeps the directory open (and its lock) through every export.
    async with await fusee.Engine.open(str(data), workflows=[_load(old)]) as engine:
        for i, wid in enumerate(ids):
            await engine.start("order", wid, i)
        await _asleep(engine, ids)
        exported = await engine.export_journal("order/2")
        assert exported["id"] == "order/2" and exported["type"] == "order"
        assert [row["kind"] for row in exported["journal"]] == ["Started", "StepDone", "TimerStarted"]
        assert exported["journal"][1]["value"] == 2

        one = tmp_path / "one.fjnl"
        done = cli("export", data, "order/2", "-o", one)
        assert done.returncode == 0, done.stderr
        assert read_export(one)["journal"] == exported["journal"]  # the same document both ways

        sample = tmp_path / "journals"
        done = cli("export", "--sample", 4, data, "-o", sample)
        assert done.returncode == 0, done.stderr
        files = sorted(sample.glob("*.fjnl"))
        assert len(files) == 4  # the four most recent of six, coordinators and schedules left out
        assert {read_export(f)["id"] for f in files} == set(ids[2:])
        assert engine.run("order/0") is not None  # the application still runs on it

    shown = cli("show", one)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("order/2  run 1  type order")
    assert "StepDone" in lines[3] and 'name="charge"' in lines[3] and "value=2" in lines[3]

    same = cli("replay-check", sample, one, "--module", old)
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.splitlines()[-1] == (
        "5 journals: 5 match the code, 0 would be stuck, 0 ended runs differ, 0 unreadable"
    )

    differs = cli("replay-check", sample, "--module", "flows_new", cwd=tmp_path)
    assert differs.returncode == 1, differs.stdout + differs.stderr
    stuck = [line for line in differs.stdout.splitlines() if line.startswith("STUCK")]
    assert len(stuck) == 4
    assert "recorded step 'charge' here but the code called step 'authorize'" in stuck[0]
    assert "does not match" not in differs.stderr  # said once, on stdout
    assert "The run waits" not in differs.stdout  # the engine's advice to a waiting run is not the tool's
    assert "ctx.patched" in differs.stderr  # the ways out, said once

    # A damaged row: named with its file, counted apart, the same given alone or in a directory.
    broken = sample / "broken.fjnl"
    document = json.loads(files[0].read_text())
    del document["journal"][1]["name"]
    broken.write_text(json.dumps(document))
    for target in (broken, sample):
        checked = cli("replay-check", target, "--module", old)
        assert checked.returncode == 1, checked.stdout + checked.stderr
        errors = [line for line in checked.stdout.splitlines() if line.startswith("ERROR")]
        assert errors and str(broken) in errors[0] and "journal row 1" in errors[0], checked.stdout
    shown_broken = cli("show", broken)
    assert shown_broken.returncode == 2 and "journal row 1" in shown_broken.stderr
    outcomes = [o for o in Replayer([_load(changed)]).replay_dir(sample) if o.readable]
    assert [o.ok for o in outcomes] == [False] * 4 and all("authorize" in (o.error or "") for o in outcomes)


async def test_a_finished_run_exports_with_its_end_and_replays(tmp_path: Path):
    module = _module(tmp_path, "flows_done", "charge")
    data = tmp_path / "data"
    async with await fusee.Engine.open(str(data), workflows=[_load(module)]) as engine:
        await engine.start("order", "o-1", 1)
        await _asleep(engine, ["o-1"])
        await engine.run("o-1").terminate("done with it")
        exported = await engine.export_journal("o-1")
        assert exported["status"] == "terminated"
        assert [row["kind"] for row in exported["journal"]][-1] == "Finished"
        with pytest.raises(fusee.NotFoundError):
            await engine.export_journal("never-started")
    done = cli("export", data, "o-1", "-o", tmp_path / "o.fjnl")
    assert done.returncode == 0, done.stderr
    checked = cli("replay-check", tmp_path / "o.fjnl", "--module", module)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Under changed code an ended run differs: listed, not counted as stuck, exit 0.
    changed = _module(tmp_path, "flows_done_v2", "authorize")
    checked = cli("replay-check", tmp_path / "o.fjnl", "--module", changed)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("DIFFERS  o-1 (ended terminated")
    missing = cli("export", data, "never-started")
    assert missing.returncode == 2 and "no workflow 'never-started'" in missing.stderr


async def test_versions_counts_live_runs_per_type_and_version(tmp_path: Path):
    data = tmp_path / "data"
    v1 = _load(_module(tmp_path, "flows_v1", "charge", 1))
    v2 = _load(_module(tmp_path, "flows_v2", "charge", 2))
    async with await fusee.Engine.open(str(data), workflows=[v1]) as engine:
        for wid in ("a", "b", "c"):
            await engine.start("order", wid, 1)
        await _asleep(engine, ["a", "b", "c"])
        await engine.run("c").terminate("gone")  # ended: not live
    async with await fusee.Engine.open(str(data), workflows=[v2]) as engine:
        await engine.start("order", "d", 1)
        await _asleep(engine, ["d"])
    done = cli("versions", data, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"type": "order", "version": 1, "live": 2},
        {"type": "order", "version": 2, "live": 1},
    ]
    table = cli("versions", data).stdout.splitlines()
    assert table[0].split() == ["type", "version", "live", "runs"]


def test_each_mistake_gets_one_line_naming_it(tmp_path: Path):
    data = tmp_path / "nothing"
    data.mkdir()
    cases = [
        (("export", data, "x"), "not a Fusee data directory"),
        (("export", "--sample", "2", data, "x", "-o", tmp_path / "j"), "not both"),
        (("export", tmp_path / "missing", "x"), "neither a data directory"),
        (("show", tmp_path / "none.fjnl"), "cannot read it"),
        (
            ("replay-check", tmp_path, "--module", "no_such_module_here"),
            "cannot import 'no_such_module_here'",
        ),
        (("replay-check", tmp_path, "--module", "json"), "defines no workflow"),
        (("replay-check", tmp_path / "none.py.fjnl", "--module", tmp_path / "gone.py"), "no such file"),
    ]
    for args, message in cases:
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_mutated_exports_are_refused_naming_the_file(tmp_path: Path):
    """An export is outside input: random and mutated documents give FuseeError, never a
    crash of another kind."""
    good = {
        "format": "fusee-journal",
        "version": 1,
        "id": "o-1",
        "run": 1,
        "type": "order",
        "status": "running",
        "journal": [
            {"kind": "Started", "type": "order", "version": 1, "input": 1, "now": 0, "seed": 0},
            {"kind": "StepDone", "seq": 0, "name": "charge", "value": 1},
            {"kind": "TimerStarted", "seq": 1, "name": "hold", "due": 5},
        ],
    }
    order = _load(_module(tmp_path, "flows_fuzz", "charge"))
    replayer = Replayer([order])
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    junk = [None, 0, -1, 2**70, "", "x", [], {}, True, 1.5, {"$bytes": "zz"}, [[]]]
    path = tmp_path / "m.fjnl"
    path.write_text(json.dumps(good))
    replayer.replay_file(path)  # the unmutated one replays
    for _ in range(400):
        document = json.loads(json.dumps(good))
        target = document if rng.random() < 0.3 else rng.choice(document["journal"])
        key = rng.choice([*target.keys(), "extra"])
        target[key] = rng.choice(junk)
        raw = json.dumps(document).encode()
        if rng.random() < 0.2:
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]
        path.write_bytes(raw)
        try:
            replayer.replay_file(path)
        except fusee.FuseeError:
            pass
        except Exception as error:
            raise AssertionError(f"seed {seed}: {type(error).__name__}: {error} for {raw!r}") from error
