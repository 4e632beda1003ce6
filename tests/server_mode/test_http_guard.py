"""Who may ask the HTTP API what (server/fusee_server/http_guard.py), against a real server
and worker: each token's scope on every route the OpenAPI document lists, and what keeps
a page in a browser from using the API (a change needs JSON or `X-Fusee-Action: 1`, a
foreign `Origin` is refused, a loopback API without a token answers only this machine's
names). Fuzzed bodies and headers get 400 (or 403) with the error's code and record
nothing."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.http import Http
from tests.support.procs import Server
from tests.support.server_cli import base_url, token_file

START = {"type": "waiter", "id": "guarded-1", "input": 1}


def routes(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, path) of every operation, its parameters filled in."""
    return [
        (method.upper(), path.replace("{id}", "r-1").replace("{name}", "go").replace("{token}", "t.t"))
        for path, operations in document["paths"].items()
        for method in operations
    ]


@pytest.fixture
async def tokened(start_server, start_worker, tmp_path) -> AsyncIterator[tuple[Server, dict[str, str]]]:
    files = {scope: token_file(tmp_path, scope) for scope in ("worker", "client", "read")}
    server = start_server(
        "--token-file",
        files["worker"],
        "--client-token-file",
        files["client"],
        "--read-token-file",
        files["read"],
        "--http",
        "127.0.0.1:0",
    )
    start_worker(server.address(token_file=files["worker"]))
    yield server, {scope: Path(path).read_text().strip() for scope, path in files.items()}


async def test_each_token_reaches_what_its_scope_allows(tokened):
    server, tokens = tokened
    async with Http(base_url(server), tokens["read"]) as api:
        document = await api.ok("GET", "/v1/openapi.json")
        assert len(routes(document)) >= 12
        for method, path in routes(document):
            body = START if method == "POST" else None
            for offered in (None, "wrong", tokens["worker"][:-1]):
                status, error = await api.request(method, path, body, token=offered)
                assert (status, error["code"]) == (401, "Rejected"), (method, path, offered)
            status, answer = await api.request(method, path, body)  # the read token
            if method == "GET":
                assert status not in (401, 403), (path, answer)
            else:
                assert (status, answer["code"]) == (403, "Rejected"), (path, answer)
                assert "read" in answer["message"]
        assert (await api.ok("GET", "/v1/info"))["access"] == "read"
        assert (await api.ok("GET", "/v1/runs"))["runs"] == []  # the read token recorded nothing
        status, _ = await api.request("POST", "/v1/runs", START, token=tokens["client"])
        assert status == 201
        status, _ = await api.request(
            "POST", "/v1/runs/guarded-1/signals/go", {"value": 1}, token=tokens["worker"]
        )
        assert status == 200
        result = await api.ok("GET", "/v1/runs/guarded-1/result", wait="10000")
        assert result["result"] == [1]
        journal = (await api.ok("GET", "/v1/runs/guarded-1"))["journal"]
        assert [r["by"] for r in journal if r["kind"] == "SignalReceived"] == ["token"]  # who asked
        for scope in ("client", "worker"):
            _, info = await api.request("GET", "/v1/info", token=tokens[scope])
            assert info["access"] == scope
        # The scrape paths want a token too.
        assert (await api.request("GET", "/metrics", token=None))[0] == 401
        assert (await api.request("GET", "/metrics"))[0] == 200


@pytest.fixture
async def open_api(start_server, start_worker) -> AsyncIterator[tuple[Http, int]]:
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address())
    url = base_url(server)
    async with Http(url) as api:
        yield api, int(url.rsplit(":", 1)[1])


async def test_a_change_needs_a_json_body_or_the_action_header(open_api):
    api, _ = open_api
    text = json.dumps(START).encode()
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"},
                    {"Content-Type": "multipart/form-data; boundary=x"}, {"X-Fusee-Action": "0"},
                    {"X-Fusee-Action": "true"}):  # fmt: skip
        status, error = await api.request("POST", "/v1/runs", data=text, headers=headers)
        assert (status, error["code"]) == (400, "Rejected"), headers
        assert "X-Fusee-Action: 1" in error["message"]
    assert (await api.ok("GET", "/v1/runs"))["runs"] == []
    status, _ = await api.request("POST", "/v1/runs", data=text, headers={"X-Fusee-Action": "1"})
    assert status == 201
    again = {**START, "id": "guarded-2"}
    status, _ = await api.request(
        "POST",
        "/v1/runs",
        data=json.dumps(again).encode(),
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert status == 201


async def test_a_browser_origin_must_be_this_site(open_api):
    api, port = open_api
    for origin in (
        "http://evil.example",
        "null",
        f"https://127.0.0.1:{port}",
        f"http://127.0.0.1:{port + 1}",
    ):
        for method, body in (("GET", None), ("POST", START)):
            status, error = await api.request(method, "/v1/runs", body, headers={"Origin": origin})
            assert (status, error["code"]) == (403, "Rejected"), (origin, method)
    assert (await api.ok("GET", "/v1/runs"))["runs"] == []
    status, _ = await api.request("POST", "/v1/runs", START, headers={"Origin": f"http://127.0.0.1:{port}"})
    assert status == 201


async def test_a_loopback_api_without_a_token_answers_only_this_machine_s_names(open_api):
    api, port = open_api
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "localhost", "127.0.0.1",
                 f"localhost.:{port}", f"10.0.0.1:{port}", f"[::2]:{port}", ""):  # fmt: skip
        for method, body in (("GET", None), ("POST", START)):
            status, error = await api.request(method, "/v1/info", body, headers={"Host": host})
            assert (status, error["code"]) == (403, "Rejected"), (host, method)
        status, _ = await api.request("GET", "/metrics", headers={"Host": host})
        assert status == 403, host
    for host in (f"localhost:{port}", f"LocalHost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        status, info = await api.request("GET", "/v1/info", headers={"Host": host})
        assert status == 200, (host, info)


@pytest.mark.parametrize("listen", ["0.0.0.0", "127.0.0.1"], ids=["off-loopback", "token"])
async def test_the_host_is_not_checked_with_a_token_or_off_loopback(start_server, tmp_path, listen):
    extra = ("--token-file", token_file(tmp_path)) if listen == "127.0.0.1" else ()
    server = start_server("--http", f"{listen}:0", *extra)
    token = Path(extra[1]).read_text().strip() if extra else None
    async with Http(base_url(server), token) as api:
        status, info = await api.request("GET", "/v1/info", headers={"Host": "fusee.example.com"})
        assert status == 200, info


# -- fuzzed requests ----------------------------------------------------------------------


def send(base: str, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.fixture
def fuzzed(start_server, start_worker) -> Iterator[str]:
    """A server and a worker; afterwards nothing is recorded and nothing went wrong."""
    server = start_server("--http", "127.0.0.1:0")
    worker = start_worker(server.address())
    base = base_url(server)
    yield base
    status, listed = send(base, "GET", "/v1/runs", None, {})
    assert (status, listed["runs"]) == (200, [])
    assert not [line for line in [*server.lines, *worker.lines] if "Traceback" in line], server.output()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
NOT_A_STR = st.none() | st.booleans() | st.integers() | st.lists(st.text(max_size=3), max_size=2)
BODIES = (
    st.binary(max_size=120)
    | JSON.map(lambda value: json.dumps(value).encode())
    | st.fixed_dictionaries(
        {"type": NOT_A_STR | st.just(""), "id": NOT_A_STR | st.text(max_size=4)},
        optional={"input": JSON, "options": JSON, "unknown": JSON},
    ).map(lambda value: json.dumps(value).encode())
)
CHANGES = ["/v1/runs", "/v1/runs/r-1/signals/go", "/v1/runs/r-1/updates/note", "/v1/runs/r-1/cancel"]


def _valid(path: str, body: bytes) -> bool:
    """A body that could be taken (so a 400 is not what it must get)."""
    try:
        value = json.loads(body or b"{}")  # no body: the defaults
    except ValueError:
        return False
    if not isinstance(value, dict):
        return False
    if path == "/v1/runs":
        return isinstance(value.get("type"), str) and bool(value["type"]) and isinstance(value.get("id"), str)
    allowed = (
        {"value", "id", "start"} if "signals" in path else {"arg", "id"} if "updates" in path else {"reason"}
    )
    return value.keys() <= allowed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(CHANGES), body=BODIES)
def test_a_fuzzed_body_gets_400_with_its_code_and_records_nothing(fuzzed, path, body):
    status, answer = send(fuzzed, "POST", path, body, {"Content-Type": "application/json"})
    if _valid(path, body):
        assert status in (400, 404), (body, answer)  # no run r-1: nothing to signal, update or cancel
    else:
        assert status == 400, (body, answer)
    assert answer["code"] in ("Rejected", "Codec", "NotFound", "UnknownWorkflow"), answer
    assert answer["docs"] == f"docs/errors.md#{answer['code'].lower()}"


HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content_type=HEADER_TEXT, action=st.none() | HEADER_TEXT, origin=st.none() | HEADER_TEXT)
def test_fuzzed_headers_are_refused_with_their_code_and_record_nothing(fuzzed, content_type, action, origin):
    """A valid start, under headers that a browser page could send: refused, every time."""
    site = fuzzed.removeprefix("http://")
    if content_type.partition(";")[0].strip().lower() == "application/json" or action == "1":
        action = "1 " if action == "1" else action  # both would let it through: make one wrong
        content_type = "text/" + content_type
    if origin == fuzzed:
        origin = None
    headers = {"Content-Type": content_type} | ({"X-Fusee-Action": action} if action is not None else {})
    headers |= {"Origin": origin} if origin is not None else {}
    status, answer = send(fuzzed, "POST", "/v1/runs", json.dumps(START).encode(), headers)
    assert status == (403 if origin is not None else 400), (headers, answer)
    assert answer["code"] == "Rejected" and answer["docs"] == "docs/errors.md#rejected", answer
    assert site  # the Host stayed this site's: only the headers above were wrong


async def test_requests_in_parallel_each_get_their_answer(open_api):
    """Many calls in flight at once through the one relay caller: each answer goes to its
    own request."""
    api, _ = open_api
    starts = [{"type": "steps", "id": f"par-{i}", "input": 1} for i in range(30)]
    answers = await asyncio.gather(*(api.ok("POST", "/v1/runs", s) for s in starts))
    assert [a["id"] for a in answers] == [s["id"] for s in starts]
    polls = [api.ok("GET", f"/v1/runs/par-{i}/result", wait="10000") for i in range(30)]
    results = await asyncio.gather(*polls)
    assert [r["id"] for r in results] == [s["id"] for s in starts]
    assert all(r["status"] == "ok" and len(r["result"]) == 1 for r in results)
