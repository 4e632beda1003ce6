"""The HTTP API's `/v1` routes end to end: a real `fusee server --http`, a real worker
process (or an invoked handler under uvicorn), and requests from a plain HTTP client
(tests/support/http.py: aiohttp and JSON, no fusee on the request's path)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import get_args

import pytest
from fusee_server.http_types import ListedStatus

from fusee.engine.run_handle import LISTED
from tests.support.cluster import Cluster
from tests.support.http import Http, path_id
from tests.support.procs import Proc
from tests.support.server_cli import base_url

ORDER = {"item": "pen", "quantity": 2}


@pytest.fixture
async def api(start_server, start_worker, tmp_path) -> AsyncIterator[Http]:
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address(), steps_file=tmp_path / "steps")
    async with Http(base_url(server)) as http:
        yield http
    assert not [line for line in server.lines if "Traceback" in line], server.output()


def run(id: str, tail: str = "") -> str:
    return f"/v1/runs/{path_id(id)}{tail}"


async def test_start_query_update_signal_and_result(api):
    status, started = await api.post("/v1/runs", {"type": "checkout", "id": "co/1", "input": ORDER})
    assert status == 201 and started["id"] == "co/1" and 0 <= started["shard"] < 4, started
    assert await api.ok("GET", run("co/1", "/queries/phase")) == {"id": "co/1", "result": "review"}
    updated = await api.ok("POST", run("co/1", "/updates/note"), {"arg": "gift wrap", "id": "u-1"})
    assert updated == {"id": "co/1", "updateId": "u-1", "result": 1}
    again = await api.ok("POST", run("co/1", "/updates/note"), {"arg": "gift wrap", "id": "u-1"})
    assert again["result"] == 1  # the same update ID: applied once
    pending = await api.ok("GET", run("co/1", "/result"), wait="50")
    assert pending == {"id": "co/1", "done": False, "status": "running"}
    signalled = await api.ok("POST", run("co/1", "/signals/review"), {"value": True})
    assert signalled["signal"] == "review" and len(signalled["signalId"]) == 32
    result = await api.ok("GET", run("co/1", "/result"), wait="10000")
    assert result == {
        "id": "co/1",
        "done": True,
        "status": "ok",
        "result": {"item": "pen", "quantity": 2, "approved": True, "notes": ["gift wrap"]},
    }
    described = await api.ok("GET", run("co/1"))
    assert {k: described[k] for k in ("id", "run", "type", "status")} == {
        "id": "co/1",
        "run": 1,
        "type": "checkout",
        "status": "ok",
    }
    kinds = [record["kind"] for record in described["journal"]]
    assert kinds == [
        "Started",
        "WaitStarted",
        "UpdateAccepted",
        "UpdateDone",
        "SignalReceived",
        "StepDone",
        "Finished",
    ]
    journal = {record["kind"]: record for record in described["journal"]}
    assert journal["Started"]["input"] == ORDER  # payloads as the JSON they hold
    assert journal["SignalReceived"]["id"] == signalled["signalId"]
    assert journal["SignalReceived"]["by"] == "http"  # who asked: a server without tokens
    assert journal["StepDone"] == {"kind": "StepDone", "seq": 1, "name": "ship", "value": "2 x pen"}
    summary = await api.ok("GET", run("co/1"), journal="false")
    assert "journal" not in summary and summary["status"] == "ok"


async def calls_in_flight(api: Http) -> float:
    status, text = await api.get("/metrics")
    assert status == 200
    found = re.search(r"^fusee_calls_in_flight (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


async def test_a_long_poll_answers_as_the_run_ends(api):
    """Polls of one run share one `result` call to its worker, however many wait."""
    await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "poll-1", "input": 1})
    polls = [asyncio.ensure_future(api.ok("GET", run("poll-1", "/result"), wait="20000")) for _ in range(5)]
    await asyncio.sleep(0.3)
    assert not any(poll.done() for poll in polls)  # they wait: the run waits for its signal
    assert await calls_in_flight(api) == 1
    await api.ok("POST", run("poll-1", "/signals/go"), {"value": 7})
    answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert [answer["result"] for answer in answers] == [[7]] * 5
    assert await calls_in_flight(api) == 0


async def test_a_signal_sent_again_under_its_id_is_recorded_once(api):
    await api.ok("POST", "/v1/runs", {"type": "collector", "id": "col-1", "input": 0})
    for _ in range(3):
        await api.ok("POST", run("col-1", "/signals/go"), {"value": 5, "id": "same"})
    await api.ok("POST", run("col-1", "/signals/go"), {"value": 6})
    assert (await api.ok("GET", run("col-1", "/queries/received")))["result"] == 2
    await api.ok("POST", run("col-1", "/signals/go"), {"value": -1})
    assert (await api.ok("GET", run("col-1", "/result"), wait="10000"))["result"] == [5, 6]


async def test_signal_with_start_and_start_options(api):
    body = {"value": 3, "start": {"type": "waiter", "id": "sws-1", "input": 1}}
    assert (await api.ok("POST", run("sws-1", "/signals/go"), body))["signal"] == "go"
    assert (await api.ok("GET", run("sws-1", "/result"), wait="10000"))["result"] == [3]
    # An ID policy: the ID is taken by a running run, and "fail" refuses the start.
    await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "pol-1", "input": 1})
    taken = {"type": "waiter", "id": "pol-1", "input": 1, "options": {"idPolicy": {"running": "fail"}}}
    status, error = await api.post("/v1/runs", taken)
    assert (status, error["code"], error["docs"]) == (409, "AlreadyExists", "docs/errors.md#alreadyexists")
    kept = {**taken, "options": {"idPolicy": {"running": "use-existing"}}}
    assert (await api.post("/v1/runs", kept))[0] == 201
    # A delayed start exists at once, and its code begins later.
    delayed = {"type": "steps", "id": "later-1", "input": 1, "options": {"delay": "300ms", "timeout": "1h"}}
    await api.ok("POST", "/v1/runs", delayed)
    assert (await api.ok("GET", run("later-1"), journal="false"))["status"] == "running"
    assert (await api.ok("GET", run("later-1", "/result"), wait="10000"))["status"] == "ok"
    status, error = await api.post("/v1/runs", {**delayed, "options": {"delay": 5, "at": 1}})
    assert (status, error["code"]) == (400, "Rejected") and "not both" in error["message"]
    status, error = await api.post("/v1/runs", {**delayed, "options": {"at": "2030-01-01T00:00:00"}})
    assert (status, error["code"]) == (400, "Rejected") and "time zone" in error["message"]


async def test_cancel_and_terminate_end_runs_with_their_failure(api):
    for id in ("end-1", "end-2"):
        await api.ok("POST", "/v1/runs", {"type": "waiter", "id": id, "input": 1})
    assert await api.ok("POST", run("end-1", "/cancel"), {"reason": "not needed"}) == {"id": "end-1"}
    status, _ = await api.post(run("end-2", "/terminate"))  # no body: X-Fusee-Action
    assert status == 200
    cancelled = await api.ok("GET", run("end-1", "/result"), wait="10000")
    assert (cancelled["done"], cancelled["status"], cancelled["error"]["code"]) == (
        True,
        "cancelled",
        "Cancelled",
    )
    terminated = await api.ok("GET", run("end-2", "/result"), wait="10000")
    assert (terminated["status"], terminated["error"]["code"]) == ("terminated", "Terminated")
    assert terminated["error"]["docs"] == "docs/errors.md#terminated"


async def test_a_failed_run_s_result_carries_its_recorded_failure(api):
    await api.ok("POST", "/v1/runs", {"type": "limited", "id": "bad-1", "input": {}})  # raises KeyError
    result = await api.ok("GET", run("bad-1", "/result"), wait="10000")
    assert (result["done"], result["status"]) == (True, "failed"), result
    assert result["error"]["code"] == "WorkflowFailed" and result["error"]["cause"]["message"], result


async def test_errors_are_json_with_their_code_and_docs(api):
    cases = [
        (await api.get(run("nobody")), 404, "NotFound"),
        (await api.get(run("nobody", "/result")), 404, "NotFound"),
        (await api.post(run("nobody", "/signals/go"), {"value": 1}), 404, "NotFound"),
        (await api.post("/v1/runs", {"type": "no-such-type", "id": "x-1"}), 400, "UnknownWorkflow"),
        (await api.post("/v1/runs", {"type": "steps", "id": ""}), 400, "Rejected"),
        (await api.post("/v1/runs", {"type": "checkout", "id": "co-x", "input": {"item": 1}}), 400, "Codec"),
        (await api.get("/v1/runs", status="sleeping"), 400, "Rejected"),
        (await api.get("/v1/runs", limit="0"), 400, "Rejected"),
        (await api.get("/v1/runs", cursor="%%%"), 400, "Rejected"),
        (await api.get("/v1/no-such-route"), 404, "NotFound"),
        (await api.request("DELETE", "/v1/runs", headers={"X-Fusee-Action": "1"}), 405, "Rejected"),
    ]
    await api.ok("POST", "/v1/runs", {"type": "checkout", "id": "co-e", "input": ORDER})
    cases += [
        (await api.post(run("co-e", "/updates/note"), {"arg": ""}), 400, "Rejected"),  # its validator
        (await api.get(run("co-e", "/queries/phase"), arg="{not json"), 400, "Rejected"),
        (await api.get(run("co-e", "/queries/nope")), 400, "Rejected"),
    ]
    too_big = {"type": "steps", "id": "big-1", "input": "x" * (17 << 20)}
    cases.append((await api.post("/v1/runs", too_big), 413, "Rejected"))
    for (status, error), expected, code in cases:
        assert (status, error.get("code")) == (expected, code), error
        assert error["docs"] == f"docs/errors.md#{code.lower()}" and error["message"], error


async def test_list_filters_by_type_status_and_prefix_and_pages_in_id_order(api):
    ids = [f"acme/{i:02}" for i in range(7)] + ["globex/1", "globex/2"]
    for id in ids:
        await api.ok("POST", "/v1/runs", {"type": "waiter", "id": id, "input": 1})
    await api.ok("POST", "/v1/runs", {"type": "steps", "id": "acme/steps", "input": 1})
    await api.ok("GET", run("acme/steps", "/result"), wait="10000")
    seen, cursor, pages = [], None, 0
    while True:
        params = {"prefix": "acme/", "limit": "3", "type": "waiter"} | ({"cursor": cursor} if cursor else {})
        page = await api.ok("GET", "/v1/runs", **params)
        seen += [row["id"] for row in page["runs"]]
        pages += 1
        assert all(row["status"] == "running" and row["type"] == "waiter" for row in page["runs"])
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert (seen, pages) == (ids[:7], 3)
    everything = await api.ok("GET", "/v1/runs")
    assert [row["id"] for row in everything["runs"]] == sorted([*ids, "acme/steps"])
    assert "nextCursor" not in everything
    finished = await api.ok("GET", "/v1/runs", status="ok")
    assert [row["id"] for row in finished["runs"]] == ["acme/steps"]
    assert (await api.ok("GET", "/v1/runs", prefix="nobody/"))["runs"] == []


async def until(api: Http, id: str, status: str) -> None:
    """Wait until run `id` has `status`."""
    for _ in range(200):
        if (await api.ok("GET", run(id), journal="false"))["status"] == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{id} never became {status}")


async def test_resume_retry_and_reset_and_who_asked(api, tmp_path):
    await api.ok("POST", "/v1/runs", {"type": "flaky", "id": "fl/paused", "input": True})
    await api.ok("POST", "/v1/runs", {"type": "flaky", "id": "fl/failed", "input": False})
    await until(api, "fl/paused", "paused")
    await until(api, "fl/failed", "failed")
    assert [r["id"] for r in (await api.ok("GET", "/v1/runs", status="paused"))["runs"]] == ["fl/paused"]
    for path, body, words in (
        (run("fl/failed", "/resume"), None, "has no step paused out of retries"),
        (run("fl/paused", "/retry"), None, "has not failed"),
        (run("fl/paused", "/reset"), {"beforeStep": "nope"}, "has no step 'nope'"),
    ):
        status, error = await api.post(path, body)
        assert (status, error["code"]) == (400, "Rejected") and words in error["message"], error
    (tmp_path / "steps.fixed").write_text("deployed")  # the fix, deployed
    assert await api.ok("POST", run("fl/paused", "/resume")) == {"id": "fl/paused"}
    assert await api.ok("POST", run("fl/failed", "/retry")) == {"id": "fl/failed", "run": 2}
    for id in ("fl/paused", "fl/failed"):
        assert (await api.ok("GET", run(id, "/result"), wait="10000"))["result"] == "charged"
    reset = await api.ok(
        "POST", run("fl/failed", "/reset"), {"beforeStep": "charge", "reapplySignals": False}
    )
    assert reset == {"id": "fl/failed", "run": 3}
    assert (await api.ok("GET", run("fl/failed", "/result"), wait="10000"))["result"] == "charged"
    resumed = [r for r in (await api.ok("GET", run("fl/paused")))["journal"] if r["kind"] == "Resume"]
    assert [(r["name"], r["by"]) for r in resumed] == [("charge", "http")]  # who asked: no token
    journal = (await api.ok("GET", run("fl/failed")))["journal"]
    assert journal[0]["kind"] == "Started" and journal[-1]["kind"] == "Finished"


async def token_of(tmp_path: Path, id: str) -> str:
    """The completion token run `id`'s send function wrote (flows.awaiting)."""
    path = tmp_path / f"steps.{id}.token"
    for _ in range(200):
        if path.exists() and path.read_text():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{id} sent no token")


async def test_callbacks_complete_and_fail_the_step_their_token_names(api, tmp_path):
    for id in ("cb-1", "cb-2"):
        await api.ok("POST", "/v1/runs", {"type": "awaiting", "id": id, "input": 0})
    token = await token_of(tmp_path, "cb-1")
    assert await api.ok("POST", f"/v1/complete/{token}", {"approved": True}) == {"id": "cb-1"}
    assert (await api.ok("GET", run("cb-1", "/result"), wait="10000"))["result"] == {"approved": True}
    status, error = await api.post(f"/v1/complete/{token}", {"again": True})  # used: stale
    assert (status, error["code"]) == (400, "Rejected"), error
    failure = {"message": "declined", "code": "card_declined", "details": {"last4": "4242"}}
    assert await api.ok("POST", f"/v1/fail/{await token_of(tmp_path, 'cb-2')}", failure) == {"id": "cb-2"}
    failed = await api.ok("GET", run("cb-2", "/result"), wait="10000")
    assert (failed["done"], failed["status"]) == (True, "failed"), failed
    causes, cause = [], failed["error"].get("cause")
    while cause is not None:
        causes.append(cause)
        cause = cause.get("cause")
    assert any(c.get("code") == "card_declined" and c.get("details") == {"last4": "4242"} for c in causes), (
        failed
    )
    for path in ("/v1/complete/not-a-token", "/v1/fail/x.y"):
        status, error = await api.post(path, "declined")
        assert (status, error["code"], error["message"]) == (400, "Rejected", "not a completion token"), error


def test_the_listed_statuses_are_the_engine_s():
    assert set(get_args(ListedStatus)) == {status.value for status in LISTED}


async def test_info_names_the_server(api):
    info = await api.ok("GET", "/v1/info")
    assert info == {"api": "v1", "version": info["version"], "shards": 4, "access": "open", "invoker": False}
    assert await api.ok("GET", "/v1/invocations") == {"endpoints": []}


# -- an invoked handler -----------------------------------------------------------------


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Iterator[Cluster[Proc]]:
    cluster: Cluster[Proc] = Cluster(tmp_path, procs=procs)
    cluster.start_server(*cluster.invoke_config(budgetMs=1500), "--http", "127.0.0.1:0")
    cluster.start_handler()
    yield cluster
    cluster.close()


async def test_calls_wait_for_an_invoked_worker_as_a_client_s_do(cluster):
    """No worker runs: each call waits at the server for the invocation it causes, and a
    result's long poll outlives the invocation that started the run (its budget ends
    while the run sleeps; the next one, brought by the timer, finishes it)."""
    assert cluster.server is not None
    async with Http(base_url(cluster.server)) as api:
        await api.ok("POST", "/v1/runs", {"type": "checkout", "id": "inv-co", "input": ORDER})
        assert (await api.ok("GET", run("inv-co", "/queries/phase")))["result"] == "review"
        await api.ok("POST", run("inv-co", "/signals/review"), {"value": False})
        done = await api.ok("GET", run("inv-co", "/result"), wait="20000")
        assert done["result"]["approved"] is False
        await api.ok("POST", "/v1/runs", {"type": "sleeper", "id": "inv-nap", "input": 2.5})
        slept = await api.ok("GET", run("inv-nap", "/result"), wait="30000")
        assert (slept["done"], slept["status"]) == (True, "ok"), slept
        rows = (await api.ok("GET", "/v1/runs"))["runs"]
        assert [row["id"] for row in rows] == ["inv-co", "inv-nap"]
        info = await api.ok("GET", "/v1/info")
        assert info["invoker"] is True
        invocations = await api.ok("GET", "/v1/invocations")
        assert invocations["endpoints"][0]["succeeded"] >= 2, invocations
    assert not cluster.problems(), cluster.outputs()
