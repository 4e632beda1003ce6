"""The invocations page of a server that invokes a handler (uvicorn, handlers/asgi.py):
its endpoint and counts, refreshed in place as invocations happen."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import expect

from tests.support.cluster import Cluster
from tests.support.http import Http
from tests.support.procs import Proc
from tests.support.server_cli import base_url


async def test_the_invocations_page_follows_the_invoker_live(procs: list[Proc], tmp_path: Path, browser):
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    server = cluster.start_invoked("--http", "127.0.0.1:0")
    url = base_url(server)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        page.set_default_timeout(20_000)
        await page.goto(url + "/invocations")
        await expect(page.locator(".endpoint h2")).to_have_text(cluster.handler_url)
        sent = page.locator(".endpoint td.invocations")
        before = int(await sent.inner_text())
        async with Http(url) as api:
            await api.ok("POST", "/v1/runs", {"type": "steps", "id": "inv-1", "input": 2})
            assert (await api.ok("GET", "/v1/runs/inv-1/result", wait="20000"))["status"] == "ok"
        # No reload: htmx polls the live part and the count moves.
        async with page.expect_request("**/invocations/live"):
            pass
        await expect(sent).not_to_have_text(str(before))
        assert int(await sent.inner_text()) > before
        await expect(page.locator(".endpoint td.succeeded")).not_to_have_text("0")
        await page.goto(url + "/shards")
        await expect(page.locator("#shards .holder")).to_have_count(4)
    finally:
        await context.close()
    assert not [line for line in server.lines if "Traceback" in line], server.output()
