"""Crash tests: a child process runs workflows in local mode and is killed with SIGKILL at
random moments, then restarted, again and again (50 kills per CI run; `--run-slow` for
a longer run). A churn variant gives the child small segments and frequent checkpoints,
parks its runs, and has it close and reopen the directory in a loop; some kills come
right after the child starts: kills land in rolls, retirements, checkpoints, clean
closes and recoveries. Pass:
1. every start the child acknowledged completes;
2. no recorded step result ever changes (every observation after every restart agrees,
   and the final result is that value);
3. a step's effect appears more than once only across a kill, with the same key, and the
   value recorded is the last run's (the earlier run's result was never durable).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.crash.lines import whole_lines

ROOT = Path(__file__).resolve().parents[2]


def spawn(data: Path, prefix: Path, *extra: str, runs: int = 10_000) -> subprocess.Popen[bytes]:
    with open(f"{prefix}.stderr", "ab") as err:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "tests.crash.child", str(data), str(prefix), "--runs", str(runs), *extra],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def lines(prefix: Path, kind: str, fields: int = 4) -> list[list[str]]:
    path = Path(f"{prefix}.{kind}")
    if not path.exists():
        return []
    # Only lines written in full: a kill can cut the child's last write short.
    return [line.split(" ", fields - 1) for line in whole_lines(path.read_text())]


def stderr_of(prefix: Path) -> str:
    return Path(f"{prefix}.stderr").read_text()[-3000:]


def run_kills(tmp_path: Path, kills: int, seed: int, runs: int = 10_000, churn: bool = False) -> None:
    rng = random.Random(seed)
    data, prefix = tmp_path / "data", tmp_path / "run"
    Path(f"{prefix}.acks").touch()
    killed: set[str] = set()
    extra = ("--churn",) if churn else ()
    for kill in range(kills):
        child = spawn(data, prefix, *extra, runs=runs)
        killed.add(str(child.pid))
        if churn and rng.random() < 0.3:
            delay = rng.uniform(0.05, 0.4)  # during the interpreter's start or the recovery
        else:
            delay = rng.uniform(0.25, 0.9)  # startup takes part of it: kills land anywhere
        time.sleep(delay)
        if child.poll() is not None:
            raise AssertionError(f"the child exited by itself before kill {kill}: {stderr_of(prefix)}")
        child.send_signal(signal.SIGKILL)
        child.wait()
    drain = spawn(data, prefix, "--drain", *extra)
    assert drain.wait(timeout=120) == 0, f"the draining child failed: {stderr_of(prefix)}"
    check_write_path(tmp_path, prefix)
    check(prefix, kills, killed)


def check_write_path(tmp_path: Path, prefix: Path) -> None:
    """The kills landed on the path the log's writes take in production: through io_uring
    from the event loop where this kernel gives a ring (a child whose log falls back to
    the writer thread says so on its standard error), so acknowledged writes reaped from
    the ring are what is checked."""
    from fusee_server import _native

    probe = tmp_path / "probe"
    directory = _native.Directory(probe, 1, 1 << 20)
    log = _native.Log(str(probe / "wal"), 1)
    log.start_writer()
    expected = log.write_path
    log.stop_writer()
    del log
    directory.release()
    said = Path(f"{prefix}.stderr").read_text()
    if expected == "io_uring":
        assert "writer thread" not in said, stderr_of(prefix)
    else:
        assert "through a writer thread" in said, stderr_of(prefix)


def check(prefix: Path, kills: int, killed: set[str]) -> None:
    acked = {parts[1] for parts in lines(prefix, "acks")}
    results: dict[str, Any] = {}
    for _, wid, text in lines(prefix, "results", 3):
        # A run's result is read again in each life of the child: always the same.
        assert results.setdefault(wid, json.loads(text)) == json.loads(text), f"{wid}: results differ"
    assert len(acked) >= kills // 2, f"too few starts acknowledged to mean anything ({len(acked)})"
    # 1. Every acknowledged start completed.
    missing = sorted(acked - set(results))
    assert not missing, f"acknowledged starts that never completed: {missing[:10]}"
    # 2. Recorded step results never change.
    observed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for _, wid, step, value in lines(prefix, "observed"):
        observed[(wid, step)].add(value)
    changed = {k: v for k, v in observed.items() if len(v) > 1}
    assert not changed, f"recorded step results changed: {list(changed.items())[:5]}"
    for wid, values in results.items():
        for i, value in enumerate(values):
            seen = observed.get((wid, f"s{i}"))
            assert seen is None or seen == {value}, f"{wid} s{i}: observed {seen}, result {value}"
    # 3. Effects twice only across a kill, same key, the last one recorded.
    by_key: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for _, key, value, pid in lines(prefix, "effects"):
        by_key[key].append((value, pid))
    reruns = 0
    for wid, values in results.items():
        for seq, value in zip((0, 1, 3, 4), values, strict=True):  # positions: s0 s1 nap s2 s3
            runs = by_key.get(f"{wid}/1/{seq}", [])
            assert runs, f"{wid} position {seq}: a recorded result with no effect"
            pids = [pid for _, pid in runs]
            assert len(set(pids)) == len(pids), f"{wid}/{seq} ran twice in one process: {runs}"
            assert runs[-1][0] == value, f"{wid}/{seq}: recorded {value}, last effect {runs[-1]}"
            # Every run but the recorded one was cut short by a kill.
            assert all(pid in killed for _, pid in runs[:-1]), f"{wid}/{seq} reran without a kill: {runs}"
            reruns += len(runs) - 1
    print(f"{len(acked)} starts acknowledged, {len(results)} results, {reruns} steps ran again after a kill")


@pytest.mark.timeout(300)
def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    run_kills(tmp_path, kills=int(os.environ.get("FUSEE_CRASH_KILLS", "50")), seed=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_many_kills(tmp_path: Path) -> None:
    # Past `runs` the child starts nothing new: later kills hit recovery and idle shards.
    run_kills(tmp_path, kills=300, seed=2, runs=20_000)


@pytest.mark.timeout(300)
def test_sigkill_while_segments_roll_checkpoints_retire_and_the_child_closes_and_reopens(
    tmp_path: Path,
) -> None:
    run_kills(tmp_path, kills=int(os.environ.get("FUSEE_CRASH_CHURN_KILLS", "25")), seed=3, churn=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_many_kills_with_churn(tmp_path: Path) -> None:
    run_kills(tmp_path, kills=300, seed=4, runs=20_000, churn=True)
