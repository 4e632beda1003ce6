"""Shared fixtures: a fresh TestEngine per test (`kit`), and real processes stopped after
the test whatever it did to them (`procs`, `start_server`, `start_worker`). What the tests
share besides fixtures is in tests/support/."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fusee.testing import TestEngine
from tests.support.procs import Proc, Server, Worker


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run the long crash and soak runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long run: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["instant", "flush_on_turn", "local"])
async def kit(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[TestEngine]]]:
    """`t = await kit(wf1, wf2, shards=4)`: a TestEngine, closed after the test.

    Every test runs three times: on memory storage that is durable on append; on memory
    storage whose records become durable a loop turn later and are lost by a crash until
    then; and in local mode, on a data directory with the Rust disk path, where `crash()`
    recovers from the files."""
    opened: list[TestEngine] = []
    mode = request.param

    async def open_kit(*workflows: Any, **options: Any) -> TestEngine:
        if mode == "flush_on_turn":
            options.setdefault("flush_on_turn", True)
        elif mode == "local":
            options.setdefault("dir", tmp_path / f"data-{len(opened)}")
        t = await TestEngine.open(workflows=list(workflows), **options)
        opened.append(t)
        return t

    yield open_kit
    for t in opened:
        if not t.engine.closed:
            await t.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        if proc.popen.poll() is None:
            proc.kill()
        proc.close()


@pytest.fixture
def start_server(procs: list[Proc], tmp_path: Path) -> Callable[..., Server]:
    def start(*extra: str, dir: Path | None = None, **options: Any) -> Server:
        server = Server(dir or tmp_path / "server", *extra, **options)
        procs.append(server)
        return server

    return start


@pytest.fixture
def start_worker(procs: list[Proc]) -> Callable[..., Worker]:
    def start(address: str, **options: Any) -> Worker:
        worker = Worker(address, **options)
        procs.append(worker)
        return worker

    return start


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A private PostgreSQL cluster for the whole run (tests/support/postgres.py). Missing
    PostgreSQL fails the tests in CI, where scripts/setup installs it, and skips them
    elsewhere, saying why."""
    import os

    from tests.support.postgres import Postgres, missing

    why = missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the PostgreSQL tests: {why}")
        pytest.skip(why)
    cluster = Postgres().init(fsync="on", synchronous_commit="on", wal_level="replica").start()
    yield cluster
    cluster.remove()


@pytest.fixture
def pg_url(postgres: Any) -> str:
    """A fresh database of the session's cluster, for one test."""
    return str(postgres.database())
