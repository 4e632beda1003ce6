"""The HTTP API served by an engine in this process (fusee_server/http_engine.py): the
same routes as `fusee server --http`, answered by the engine itself, from a plain HTTP
client."""

from __future__ import annotations

import pytest
from fusee_server.http_engine import serve

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.http import Http

TOKEN = "engine-token-0123456789abcdef"


async def test_an_engine_serves_the_routes_itself(tmp_path):
    async with await fusee.Engine.open(str(tmp_path / "data"), workflows=WORKFLOWS) as engine:
        served = await serve(engine, port=0)
        try:
            async with Http(served.url) as api:
                order = {"item": "pen", "quantity": 2}
                await api.ok("POST", "/v1/runs", {"type": "checkout", "id": "e/1", "input": order})
                assert (await api.ok("GET", "/v1/runs/e%2F1/queries/phase"))["result"] == "review"
                assert (await api.ok("POST", "/v1/runs/e%2F1/updates/note", {"arg": "hi"}))["result"] == 1
                await api.ok("POST", "/v1/runs/e%2F1/signals/review", {"value": True})
                result = await api.ok("GET", "/v1/runs/e%2F1/result", wait="10000")
                assert result["result"] == {"item": "pen", "quantity": 2, "approved": True, "notes": ["hi"]}
                described = await api.ok("GET", "/v1/runs/e%2F1")
                assert described["journal"][-1]["kind"] == "Finished"
                received = [r for r in described["journal"] if r["kind"] == "SignalReceived"]
                assert [r["by"] for r in received] == ["http"]  # who asked, recorded here too
                await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "e/2", "input": 1})
                await api.ok("POST", "/v1/runs/e%2F2/cancel", {"reason": "no"})
                cancelled = await api.ok("GET", "/v1/runs/e%2F2/result", wait="10000")
                assert (cancelled["status"], cancelled["error"]["code"]) == ("cancelled", "Cancelled")
                listed = await api.ok("GET", "/v1/runs", prefix="e/", limit="1")
                assert [row["id"] for row in listed["runs"]] == ["e/1"] and listed["nextCursor"]
                status, error = await api.get("/v1/runs/nobody")
                assert (status, error["code"]) == (404, "NotFound")
                assert (await api.ok("GET", "/v1/info"))["access"] == "open"
                assert (await api.ok("GET", "/v1/openapi.json"))["openapi"] == "3.1.0"
                status, _ = await api.request("GET", "/v1/info", headers={"Host": "evil.example"})
                assert status == 403
        finally:
            await served.close()


async def test_with_a_token_an_engine_wants_it(tmp_path):
    async with await fusee.Engine.open(workflows=WORKFLOWS) as engine:
        with pytest.raises(fusee.RejectedError, match="HOST:PORT"):
            await engine.serve("7601")
        served = await engine.serve("127.0.0.1:0", token=TOKEN)
        try:
            async with Http(served.url) as api:
                assert (await api.get("/v1/info"))[0] == 401
                status, info = await api.request("GET", "/v1/info", token=TOKEN)
                assert (status, info["access"]) == (200, "worker")
        finally:
            await served.close()
