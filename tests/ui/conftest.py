"""The web UI in a real headless browser: Debian's `chromium` (scripts/setup installs it)
driven by Playwright through its executable path, against a real `fusee server --http`
and a real worker process."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.http import Http
from tests.support.server_cli import base_url

CHROMIUM = os.environ.get("FUSEE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Ui:
    """The site's address, a plain HTTP client of its API (to set runs up), a browser
    page, and the worker's side file (FUSEE_TEST_STEPS)."""

    url: str
    api: Http
    page: Any  # playwright.async_api.Page
    steps: Path
    errors: list[str]


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if CHROMIUM is None:
        # In CI the setup must have installed it: a skipped UI suite would pass unseen.
        if os.environ.get("CI"):
            pytest.fail(
                "no chromium on PATH in CI: scripts/setup should have installed it (see .venv/setup.log)"
            )
        pytest.skip("no chromium on PATH (scripts/setup installs it with apt-get, as root)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def ui(start_server, start_worker, tmp_path, browser) -> AsyncIterator[Ui]:
    server = start_server("--http", "127.0.0.1:0")
    steps = tmp_path / "steps"
    start_worker(server.address(), steps_file=steps)
    url = base_url(server)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("dialog", lambda dialog: dialog.accept())  # terminate and reset ask first
    async with Http(url) as api:
        yield Ui(url, api, page, steps, errors)
    await context.close()
    assert not [line for line in server.lines if "Traceback" in line], server.output()
