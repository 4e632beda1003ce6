"""The web UI of an engine serving its own API (`engine.serve`), and what every page
carries, read as plain HTTP (the browser tests are test_web_ui.py)."""

from __future__ import annotations

import html
import re

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.http import Http


async def test_an_engine_serves_the_pages_with_its_runs(tmp_path):
    async with await fusee.Engine.open(str(tmp_path / "data"), workflows=WORKFLOWS) as engine:
        served = await engine.serve("127.0.0.1:0")
        try:
            async with Http(served.url) as api:
                await api.ok("POST", "/v1/runs", {"type": "steps", "id": "e/<b>1</b>", "input": 2})
                await api.ok("GET", "/v1/runs/e%2F%3Cb%3E1%3C%2Fb%3E/result", wait="10000")
                await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "e/2", "input": 1})
                response = await api.session.get(served.url + "/")
                page = await response.text()
                assert response.status == 200 and response.content_type == "text/html"
                csp = response.headers["Content-Security-Policy"]
                assert "script-src 'self'" in csp and "unsafe-inline" not in csp
                assert html.escape("e/<b>1</b>", quote=False) in page and "<b>1</b>" not in page
                assert 'href="/runs/e%2F%3Cb%3E1%3C%2Fb%3E"' in page  # one path segment
                status, run = await api.get("/runs/e%2F%3Cb%3E1%3C%2Fb%3E")
                assert status == 200 and run.count('class="step"') == 2 and "s1" in run
                status, shards = await api.get("/shards")
                assert status == 200 and shards.count("this engine") == engine.shard_count
                status, invocations = await api.get("/invocations")
                assert status == 200 and "No endpoints" in invocations
                status, listed = await api.get("/", status="running")
                assert status == 200 and "e/2" in listed and "e/&lt;b&gt;" not in listed
                status, refused = await api.get("/", status="sleeping")
                assert status == 400 and "sleeping" in refused
                status, script = await api.get("/static/htmx.min.js")
                assert status == 200 and "htmx" in script
                await engine.schedule("nightly", {"every": "1h"}, "steps", 1)
                status, schedules = await api.get("/schedules")
                assert status == 200 and schedules.count('class="run-link"') == 1, schedules
                found = re.search(r'class="run-link" href="(/runs/[^"]+)">([^<]*nightly[^<]*)<', schedules)
                assert found, schedules
                status, schedule = await api.get(found.group(1))
                assert status == 200 and "fusee.schedule" in schedule and "every" in schedule
                # The API's browser rules cover the pages too: a rebinding name is refused.
                status, _ = await api.request("GET", "/", headers={"Host": "evil.example"})
                assert status == 403
        finally:
            await served.close()
