"""`fusee server --http`: `/metrics` (Prometheus) and `/healthz`, scraped over HTTP from
the real server process. The invoked-worker metrics are checked after real invocations:
the server POSTs to uvicorn serving `handlers.asgi:app`, whose workers run the
workflows."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

import fusee
from tests.server_mode import certs
from tests.support.handlers import SECRET, Uvicorn
from tests.support.procs import Proc, Server, environment, free_port, retry
from tests.support.server_cli import base_url, get, start_fails, token_file
from tests.support.waiting import eventually

ENDPOINT_FAMILIES = {
    "fusee_invocations_sent": "counter",
    "fusee_invocations": "counter",
    "fusee_invocations_in_flight": "gauge",
    "fusee_endpoint_backoff_seconds": "gauge",
    "fusee_endpoint_concurrency": "gauge",
    "fusee_endpoint_concurrency_configured": "gauge",
    "fusee_invoked_shards": "counter",
    "fusee_invoked_steps": "counter",
    "fusee_invocation_answer_seconds": "histogram",
    "fusee_invoked_shard_open_seconds": "histogram",
}
INVOKER_FAMILIES = {
    "fusee_shards_due": "gauge",
    "fusee_shards_scheduled": "gauge",
    "fusee_shards_invoking": "gauge",
    "fusee_shards_in_backoff": "gauge",
    "fusee_shards_overdue": "gauge",
    "fusee_handbacks": "counter",
    "fusee_invoked_left_without_report": "counter",
    "fusee_invocations_without_progress": "counter",
}
SERVER_FAMILIES = {
    "fusee_shards": "gauge",
    "fusee_shards_held": "gauge",
    "fusee_workers_connected": "gauge",
    "fusee_connections_open": "gauge",
    "fusee_calls_in_flight": "gauge",
    "fusee_calls_waiting": "gauge",
}


async def scrape(server: Server, token: str | None = None) -> dict[str, Metric]:
    status, headers, body = await get(f"{base_url(server)}/metrics", token)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    return {family.name: family for family in text_string_to_metric_families(body)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` whose labels include `labels`."""
    name = sample.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
    found = [
        s.value
        for s in families[name].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (sample, labels, families[name].samples)
    return float(found[0])


def kinds(families: dict[str, Metric]) -> dict[str, str]:
    return {name: family.type for name, family in families.items()}


# -- a server without endpoints ---------------------------------------------------------


async def test_metrics_and_healthz_are_served_and_closed_on_sigterm(start_server):
    server = start_server("--http", "127.0.0.1:0")
    families = await scrape(server)
    assert SERVER_FAMILIES.items() <= kinds(families).items()
    assert value(families, "fusee_shards") == 4
    assert value(families, "fusee_workers_connected", kind="long_lived") == 0
    assert not INVOKER_FAMILIES.keys() & families.keys()  # no invoker, none of its numbers
    status, headers, body = await get(f"{base_url(server)}/healthz")
    assert (status, body) == (200, '{"status": "serving", "shards": 4}')
    assert headers["Content-Type"].startswith("application/json")
    assert not [line for line in server.lines if "WARNING" in line], server.output()
    url = base_url(server)
    assert server.stop() == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(f"{url}/healthz")


async def test_connected_workers_and_held_shards_are_counted(start_server, start_worker):
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address(max_shards=3))
    families = await scrape(server)
    assert value(families, "fusee_workers_connected", kind="long_lived") == 1
    assert value(families, "fusee_shards_held") == 3
    assert value(families, "fusee_connections_open") >= 1


# -- the bearer token and TLS -----------------------------------------------------------


@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
async def test_with_a_token_each_path_wants_it_as_a_bearer(start_server, tmp_path, path):
    token = Path(token_file(tmp_path)).read_text().strip()
    server = start_server("--token-file", str(tmp_path / "token"), "--http", "127.0.0.1:0")
    url = base_url(server) + path
    for offered in (None, "not-the-token", token[:-1], token + "x", ""):
        status, headers, _ = await get(url, offered)
        assert status == 401, offered
        assert headers["WWW-Authenticate"].startswith("Bearer"), headers
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers={"Authorization": f"Basic {token}"}) as response:
            assert response.status == 401  # the token, but not as a bearer
    status, _, body = await get(url, token)
    assert status == 200, body
    if path == "/metrics":
        assert value(await scrape(server, token), "fusee_shards") == 4


async def test_with_tls_the_http_api_is_https_on_the_same_certificate(start_server, tmp_path):
    made = certs.make(tmp_path / "certs")
    server = start_server(
        "--tls-cert", made.server.cert, "--tls-key", made.server.key, "--http", "127.0.0.1:0"
    )
    url = base_url(server)
    assert url.startswith("https://")
    status, _, body = await get(f"{url}/healthz", tls=ssl.create_default_context(cafile=made.ca))
    assert status == 200, body
    with pytest.raises(aiohttp.ClientError):
        await get(f"{url.replace('https', 'http')}/healthz")


# -- the start: warnings and wrong settings ---------------------------------------------


@pytest.mark.parametrize("secured", [False, True], ids=["no-token", "token"])
async def test_http_off_loopback_warns_without_a_token(start_server, tmp_path, secured):
    extra = ("--token-file", token_file(tmp_path)) if secured else ()
    server = start_server("--http", "0.0.0.0:0", *extra)
    warned = [line for line in server.lines if "WARNING" in line and "--http" in line]
    assert len(warned) == 1, server.output()
    if secured:
        assert "without TLS" in warned[0]  # the token would cross the network in clear
    else:
        assert "without a token" in warned[0] and "--token-file" in warned[0]
    token = Path(extra[1]).read_text().strip() if secured else None
    assert value(await scrape(server, token), "fusee_shards") == 4


@pytest.mark.parametrize("given", ["metrics", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:65536", ":9090"])
def test_a_wrong_http_value_fails_the_start_naming_it(tmp_path, given):
    output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", "--http", given)
    assert f"--http {given!r}" in output and "HOST:PORT" in output, output


def test_an_http_port_in_use_fails_the_start_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", "--http", f"127.0.0.1:{port}")
    assert f"--http 127.0.0.1:{port}: Address already in use" in output, output
    # Checked with the other settings: before the directory opens or any listener is up.
    assert "listening on" not in output and not (tmp_path / "server").exists(), output


# -- invoked workers --------------------------------------------------------------------


@pytest.fixture
def invoked(procs: list[Proc], tmp_path: Path) -> Iterator[Server]:
    """A server with `--http` and one endpoint: uvicorn serving the handler."""
    port = free_port()
    handler = Uvicorn(
        environment(
            FUSEE_URL=f"127.0.0.1:{port}",
            FUSEE_INVOKE_SECRET=SECRET,
            FUSEE_WORKFLOWS="tests.server_mode.flows",
        )
    )
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    try:
        server = Server(
            tmp_path / "data",
            "--invoke",
            f"http://127.0.0.1:{handler.port}/",
            "--invoke-secret-file",
            str(secret),
            "--http",
            "127.0.0.1:0",
            listen=f"127.0.0.1:{port}",
        )
        procs.append(server)
        yield server
    finally:
        handler.stop()


async def test_invocations_move_the_invoker_metrics(invoked):
    endpoint = invoked.wait_for(r"invoking (\S+)").group(1)
    client = await retry(lambda: fusee.Client.connect(invoked.address()))
    run = await client.start("steps", "metrics-1", 3)
    assert len(await run.result()) == 3

    async def settled() -> dict[str, Metric] | None:
        families = await scrape(invoked)
        done = (
            value(families, "fusee_invoked_steps_total", endpoint=endpoint) >= 3
            and value(families, "fusee_shards_invoking") == 0
            and value(families, "fusee_invocations_in_flight", endpoint=endpoint) == 0
        )
        return families if done else None

    families = await eventually(settled, timeout=20.0, every=0.05)
    assert (SERVER_FAMILIES | INVOKER_FAMILIES | ENDPOINT_FAMILIES).items() <= kinds(families).items()
    succeeded = value(families, "fusee_invocations_total", endpoint=endpoint, outcome="succeeded")
    assert succeeded >= 1
    for outcome in ("failed", "timed_out", "without_lease", "throttled"):
        assert value(families, "fusee_invocations_total", endpoint=endpoint, outcome=outcome) == 0
    sent = value(families, "fusee_invocations_sent_total", endpoint=endpoint)
    assert sent == succeeded  # none in flight, none failed
    answers = value(families, "fusee_invocation_answer_seconds_count", endpoint=endpoint)
    assert answers == sent
    assert value(families, "fusee_invocation_answer_seconds_bucket", endpoint=endpoint, le="+Inf") == answers
    assert value(families, "fusee_invocation_answer_seconds_sum", endpoint=endpoint) > 0
    assert value(families, "fusee_invoked_shard_open_seconds_count", endpoint=endpoint) >= 1
    assert value(families, "fusee_invoked_shards_total", endpoint=endpoint) >= 1
    assert value(families, "fusee_endpoint_concurrency", endpoint=endpoint) == 16
    assert value(families, "fusee_endpoint_backoff_seconds", endpoint=endpoint) == 0
    assert value(families, "fusee_shards_overdue") == 0
    # The same numbers as the `invocations` call gives: read from the same state.
    counts = (await client.call("invocations", {}))["endpoints"][0]
    assert (counts["invocations"], counts["succeeded"], counts["steps"]) == (
        sent,
        succeeded,
        value(families, "fusee_invoked_steps_total", endpoint=endpoint),
    )
    await client.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offered=st.binary(max_size=80) | st.text(max_size=60).map(lambda t: t.encode("utf-8")))
def test_any_authorization_but_the_token_is_refused(http_with_token, offered):
    """Raw header bytes, whatever they are: 401 (or 400 for a header HTTP cannot carry),
    never the metrics, and the server goes on serving."""
    host, port, token = http_with_token
    if offered.strip() in (f"Bearer {token}".encode(), f"bearer {token}".encode()):
        return
    request = (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + offered + b"\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = answer.split(b" ", 2)[1] if answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) else answer[:40]
    assert status in (b"400", b"401"), answer[:200]
    assert b"fusee_shards" not in answer


@pytest.fixture
def http_with_token(start_server, tmp_path):
    token = Path(token_file(tmp_path)).read_text().strip()
    server = start_server("--token-file", str(tmp_path / "token"), "--http", "127.0.0.1:0")
    host, port = base_url(server).removeprefix("http://").rsplit(":", 1)
    yield host, int(port), token
    status, _, _ = asyncio.run(get(f"{base_url(server)}/healthz", token))
    assert status == 200  # still serving after all of it
