"""Shared fixtures: a fresh TestEngine per test, and `eventually` instead of sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from fusee.testing import TestEngine


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run the long crash and soak runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long run: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


async def eventually(check: Callable[[], Any | Awaitable[Any]], timeout_s: float = 5.0) -> Any:
    """Retry `check` (sync or async) until it returns a truthy value without raising."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            error: BaseException | None = None
        except AssertionError as exc:
            error = exc
        if asyncio.get_running_loop().time() > deadline:
            if error is not None:
                raise error
            raise AssertionError(f"condition never held within {timeout_s} s")
        await asyncio.sleep(0.001)


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
