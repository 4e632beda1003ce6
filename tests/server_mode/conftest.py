"""Fixtures for the server-mode tests: processes started here are stopped after the test,
whatever it did to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_mode.procs import Proc, Server, Worker


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
