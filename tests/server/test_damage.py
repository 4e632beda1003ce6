"""The damage matrix: every file of a data directory, damaged every way (deleted,
truncated, a byte flipped, zeroed), after a clean close and after a crash. Each case
either opens with every acknowledged start, step result and workflow result reading
back the same, or refuses with a FuseeError naming the damaged file (or its folder);
`fusee inspect` agrees with the open either way. docs/FORMAT.md holds the table of
outcomes (`python -m tests.server.test_damage` prints it).
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee import journal as R

SHARDS = 2
SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX = 16 << 10, 32 << 10  # small: many rolls
OPEN_TIMEOUT_S = 20


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("nap", "1h")
    return n


@fusee.workflow("stepper")
async def stepper(ctx: fusee.Ctx, job: list[int]) -> list[int]:
    n, steps = job
    return [await ctx.step(f"s{i}", lambda i=i: n * 100 + i) for i in range(steps)]


WORKFLOWS = [napper, stepper]


@dataclass
class Acked:
    """What the engine acknowledged: started runs, recorded step results, results."""

    starts: list[str] = field(default_factory=list)
    steps: dict[str, dict[str, bytes]] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)


def one_per_shard(engine: fusee.Engine, prefix: str) -> list[str]:
    ids: dict[int, str] = {}
    i = 0
    while len(ids) < engine.shard_count:
        ids.setdefault(engine.shard_index(f"{prefix}-{i}"), f"{prefix}-{i}")
        i += 1
    return [ids[s] for s in range(engine.shard_count)]


async def build(data: Path, crash: bool) -> Acked:
    """Small segments and frequent checkpoints, so the directory holds several segments,
    retired spares, two checkpoints per shard, and parked and finished runs' frames. Then
    a tail of records after the last checkpoints (a loaded run on each shard keeps them
    from checkpointing on going idle), and a clean close or a crash."""
    from fusee_server.store import LocalStorage

    storage = await LocalStorage.open(
        data, SHARDS, segment_bytes_min=SEGMENT_BYTES_MIN, segment_bytes_max=SEGMENT_BYTES_MAX
    )
    engine = await fusee.Engine.open(workflows=WORKFLOWS, storage=storage, park_after="60ms")
    engine.checkpoint_records = 12
    acked = Acked()
    for round in range(4):
        for wid in one_per_shard(engine, f"nap-{round}"):
            await engine.start(napper, wid, round)
            acked.starts.append(wid)
        for wid in one_per_shard(engine, f"step-{round}") + one_per_shard(engine, f"more-{round}"):
            run = await engine.start(stepper, wid, [round, 3])
            acked.starts.append(wid)
            acked.results[wid] = await run.result()
        # Every napper parks, each shard checkpoints on going idle: after four rounds,
        # two checkpoints per shard, and the segments under both retired.
        while any(shard.runs or shard.checkpoint_position < shard.appended for shard in engine.shards):
            await asyncio.sleep(0.02)
    assert list((data / "wal").glob("spare-*")), "segments were retired"
    engine.park_after_ms = 3_600_000
    engine.checkpoint_records = 1 << 40
    for wid in one_per_shard(engine, "awake"):
        await engine.start(napper, wid, 7)  # loaded from now on: no idle checkpoint
        acked.starts.append(wid)
    for wid in one_per_shard(engine, "tail"):
        run = await engine.start(stepper, wid, [9, 4])
        acked.starts.append(wid)
        acked.results[wid] = await run.result()
    for wid in acked.starts:
        journal = (await engine.run(wid).describe()).journal
        acked.steps[wid] = {rec.name: rec.value for rec in journal if isinstance(rec, R.StepDone)}
    if crash:
        engine.abandon()  # as TestEngine.crash(): nothing more is written
        await storage.abandon()
    else:
        await engine.close()
    return acked


# -- the cases -----------------------------------------------------------------------------


def live_segments(data: Path) -> list[Path]:
    return sorted(p for p in (data / "wal").glob("*.wal") if not p.name.startswith("spare-"))


def pick(data: Path, target: str) -> Path | None:
    """The file or folder a target names in `data`, or None when it has none."""
    segments = live_segments(data)
    spares = sorted((data / "wal").glob("spare-*.wal"))
    if target == "segment oldest":
        return segments[0] if segments else None
    if target == "segment middle":
        return segments[len(segments) // 2] if len(segments) >= 3 else None
    if target == "segment newest":
        return segments[-1] if len(segments) >= 2 else None
    if target == "spare":
        return spares[0] if spares else None
    if target.startswith("checkpoint"):
        _, shard, which = target.split()
        found = sorted((data / f"shard-00{shard}").glob("checkpoint-*.fck"))
        return (found[0] if which == "older" else found[-1]) if len(found) == 2 else None
    return data / target


TARGETS = [
    "fusee.meta",
    "fusee.lock",
    "segment oldest",
    "segment middle",
    "segment newest",
    "spare",
    "checkpoint 0 older",
    "checkpoint 0 newer",
    "checkpoint 1 older",
    "checkpoint 1 newer",
    "shard-000/runs-1.dat",
    "shard-001/runs-1.dat",
    "shard-000",
    "wal",
]


def last_batch(path: Path) -> int | None:
    """The offset of the last batch in a segment (each begins a block), or None."""
    data = path.read_bytes()
    found = [at for at in range(4096, len(data), 4096) if data[at : at + 4] == b"FBAT"]
    return found[-1] if found else None


def damages(path: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    """Every damage to apply to `path`, by name."""
    if path.is_dir():
        yield "deleted", lambda: shutil.rmtree(path)
        if path.name == "wal":
            yield "emptied", lambda: empty(path)
        return
    size = path.stat().st_size
    yield "deleted", path.unlink
    for at in sorted({0, 1, 4096, size // 2, size - 1}):
        if 0 <= at < size:
            yield f"truncated at {at}", functools.partial(truncate, path, at)
    flips = {0, 10, 48, size // 2, size - 1}
    if path.suffix == ".wal":
        flips |= {4096 + 100}
        batch = last_batch(path)
        if batch is not None:
            flips.add(batch + 100)  # inside the segment's last batch
    if path.name == "fusee.meta":
        flips.add(path.read_text().index("shards=") + 7)  # the shard count
    for at in sorted(flips):
        if 0 <= at < size:
            yield f"flipped at {at}", functools.partial(flip, path, at)
    yield "zeroed", lambda: path.write_bytes(bytes(size))


def empty(folder: Path) -> None:
    for child in folder.iterdir():
        child.unlink()


def truncate(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(at)


def flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


# -- the check -----------------------------------------------------------------------------


async def check(data: Path, acked: Acked) -> None:
    """Every acknowledged start, step result and workflow result reads back the same."""
    engine = await asyncio.wait_for(fusee.Engine.open(str(data), workflows=WORKFLOWS), OPEN_TIMEOUT_S)
    try:
        for wid in acked.starts:
            journal = (await engine.run(wid).describe()).journal
            steps = {rec.name: rec.value for rec in journal if isinstance(rec, R.StepDone)}
            for name, value in acked.steps[wid].items():
                assert steps.get(name) == value, f"{wid} step {name}: {steps.get(name)!r}, not {value!r}"
        for wid, result in acked.results.items():
            assert await asyncio.wait_for(engine.run(wid).result(), 10) == result, wid
    finally:
        await engine.close()


def shown(path: Path, data: Path) -> list[str]:
    """Names a refusal may give for damage to `path`: the file (by its name in the
    directory) or its folder."""
    relative = path.relative_to(data)
    names = [path.name, str(relative)]
    if len(relative.parts) > 1:
        names.append(relative.parts[0])
    return names


OUTCOMES: dict[tuple[str, str, str], str] = {}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Acked]]:
    built = {}
    for state in ("closed", "crashed"):
        data = tmp_path_factory.mktemp("damage-base") / state
        built[state] = (data, asyncio.run(build(data, crash=state == "crashed")))
    return built


class Counts:
    """Prints the matrix's counts at the end of the session (a plugin registered when
    the module's tests begin: test modules cannot hold hooks themselves)."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        counts = Counter(outcome.split(":")[0] for outcome in OUTCOMES.values())
        terminalreporter.write_line(
            f"damage matrix: {len(OUTCOMES)} cases, {counts['opened']} opened intact, "
            f"{counts['refused']} refused naming the file"
        )


@pytest.fixture(scope="module", autouse=True)
def report_counts(request: pytest.FixtureRequest) -> None:
    if not request.config.pluginmanager.has_plugin("fusee-damage-counts"):
        request.config.pluginmanager.register(Counts(), "fusee-damage-counts")


@pytest.mark.parametrize("state", ["closed", "crashed"])
@pytest.mark.parametrize("target", TARGETS)
async def test_damage_opens_intact_or_refuses_naming_the_file(
    bases: dict[str, tuple[Path, Acked]], tmp_path: Path, state: str, target: str
) -> None:
    from fusee_server import _native

    base, acked = bases[state]
    probe = pick(base, target)
    if probe is None or not probe.exists():
        pytest.skip(f"no {target} after a {state} directory")
    names = [name for name, _ in damages(probe)]
    for name in names:
        data = tmp_path / name.replace(" ", "-")
        shutil.copytree(base, data)
        path = pick(data, target)
        assert path is not None
        dict(damages(path))[name]()
        report = json.loads(_native.inspect(str(data)))  # before the open, which may repair
        try:
            await check(data, acked)
        except fusee.FuseeError as error:
            message = str(error)
            assert any(n in message for n in shown(path, data)), f"{target} {name}: {message}"
            assert report.get("error") is not None, f"{target} {name}: the open refused, inspect did not"
            OUTCOMES[(target, name, state)] = f"refused: {message}"
        else:
            assert report.get("error") is None, f"{target} {name}: inspect says {report['error']}"
            OUTCOMES[(target, name, state)] = "opened"
        shutil.rmtree(data)


# -- the table for docs/FORMAT.md ------------------------------------------------------------


def main() -> None:
    """Run the matrix and print the table of outcomes (for docs/FORMAT.md)."""
    code = pytest.main([__file__, "-q", "-p", "no:cacheprovider"])
    if code != 0:
        sys.exit(code)
    from tests.server import test_damage  # the module pytest ran (this one is __main__)

    rows: dict[tuple[str, str], dict[str, str]] = {}
    for (target, name, state), outcome in test_damage.OUTCOMES.items():
        kind = name.split(" at ")[0]
        cell = rows.setdefault((target, kind), {})
        cell.setdefault(state, "")
        short = outcome.split(":")[0]
        if short not in cell[state]:
            cell[state] = f"{cell[state]}/{short}".strip("/")
    print("| file | damage | after a clean close | after a crash |")
    print("| --- | --- | --- | --- |")
    for (target, kind), cell in rows.items():
        print(f"| {target} | {kind} | {cell.get('closed', 'n/a')} | {cell.get('crashed', 'n/a')} |")


if __name__ == "__main__":
    main()
