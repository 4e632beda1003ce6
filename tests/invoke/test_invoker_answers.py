"""How `fusee server --invoke` takes what an endpoint answers, every part real on loopback:
a server process, an aiohttp endpoint in the test (`Flaky`: a throttle, a redirect, an
error, or the real handler behind it once it is "up"), uvicorn serving the handler, a
port where nothing listens. Throttles answered `Retry-After: 0` back off (no hot loop); a
redirect is a failed answer that sends nothing elsewhere (for the Lambda Invoke API's
client too); a call waiting on an endpoint that keeps failing is told why, soon; a call
for a shard whose endpoint backs off probes it at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from fusee_server import endpoints, lambda_client
from fusee_server.invoke_answer import describe

import fusee
from tests.support.cluster import Cluster, metrics, quiet
from tests.support.handlers import AWS, FUNCTION, REGION, Listener
from tests.support.invoked import Flaky
from tests.support.procs import Proc, Server, free_port
from tests.support.waiting import eventually

SIGNED = {"content-type": "application/json"}


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


def serve(cluster: Cluster, url: str) -> Server:
    """`fusee server --invoke url` (signed with the cluster's secret), on the port the
    cluster's handler is told of."""
    return cluster.start_server(*cluster.invoking(url))


async def endpoint(client: fusee.Client) -> dict[str, Any]:
    found: dict[str, Any] = (await metrics(client))["endpoints"][0]
    return found


# -- throttles --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
async def test_throttles_that_say_retry_after_0_back_off_instead_of_looping(cluster, status):
    """Every invocation answered `status` with `Retry-After: 0`: the pause grows with each
    throttle in a row, so 3 s cost a handful of POSTs (there were thousands)."""
    throttle = Flaky(cluster.handler_port, status, 10**9, retry_after="0")
    await throttle.start()
    try:
        serve(cluster, throttle.url)
        client = await cluster.client()
        await eventually(lambda: throttle.seen >= 1, timeout=30.0, every=0.05)
        await asyncio.sleep(3)
        posts = throttle.seen
        assert posts <= 20, posts
        counts = await endpoint(client)
        assert counts["throttled"] >= 5 and counts["failed"] == 0, counts
        assert counts["concurrency"] == 1, counts
        await client.close()
    finally:
        await throttle.stop()


# -- redirects --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_a_failed_answer_and_nothing_goes_where_it_points(cluster, status):
    elsewhere = Listener()  # counts every connection made to it
    elsewhere.start()
    redirect = Flaky(
        cluster.handler_port, status, 10**9, headers={"location": f"http://{elsewhere.address}/"}
    )
    await redirect.start()
    try:
        mark = elsewhere.mark()
        serve(cluster, redirect.url)
        client = await cluster.client()
        failing = await eventually(lambda: _failed_at_least(client, 3), timeout=30.0, every=0.05)
        assert elsewhere.settled() == mark  # not one connection, signed or not
        assert f"{status}: a redirect to http://{elsewhere.address}/, not followed" in failing["lastError"]
        await client.close()
    finally:
        await redirect.stop()
        elsewhere.stop()


async def _failed_at_least(client: fusee.Client, least: int) -> dict[str, Any] | None:
    now = await endpoint(client)
    return now if now["failed"] >= least else None


async def test_the_lambda_invoke_api_client_follows_no_redirect(monkeypatch: pytest.MonkeyPatch):
    """botocore, as the direct Lambda invoke uses it: a 307 from the Invoke API's URL comes
    back as the answer (a failure), and the event is not sent to its Location."""
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    elsewhere = Listener()
    elsewhere.start()
    redirect = Flaky(free_port(), 307, 10**9, headers={"location": f"http://{elsewhere.address}/"})
    await redirect.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{redirect.port}")
    transport = lambda_client.LambdaTransport(
        endpoints.Endpoint(url=f"lambda:{FUNCTION}", region=REGION, concurrency=2)
    )
    try:
        mark = elsewhere.mark()
        answer = await transport.send(SIGNED, b"{}")
        assert redirect.seen == 1 and elsewhere.settled() == mark
        assert answer.status == 307, answer
        assert describe(answer).startswith("307: a redirect"), describe(answer)
    finally:
        transport.close()
        await redirect.stop()
        elsewhere.stop()


# -- calls waiting on an endpoint that fails ----------------------------------------------

FAILING = {
    "a wrong secret": (
        401,
        '{"error":"unauthorized"}',
        "401: the handler refused the signature: check that its secret (FUSEE_INVOKE_SECRET) is the "
        "server's --invoke-secret-file (unauthorized)",
    ),
    "a handler that cannot reach the server": (
        502,
        '{"error":"cannot connect to 127.0.0.1:1: Connection refused"}',
        "502: the handler could not reach the server: check its FUSEE_URL, token file and CA "
        "(or the function failed) (cannot connect to 127.0.0.1:1: Connection refused)",
    ),
}


@pytest.mark.parametrize(("status", "body", "said"), FAILING.values(), ids=FAILING.keys())
async def test_a_start_against_a_failing_endpoint_fails_soon_saying_why(cluster, status, body, said):
    failing = Flaky(cluster.handler_port, status, 10**9, body=body)
    await failing.start()
    try:
        serve(cluster, failing.url)
        client = await cluster.client()
        began = time.monotonic()
        with pytest.raises(fusee.NoHolderError) as raised:
            await asyncio.wait_for(client.start("steps", "doomed", 1), 20)
        assert time.monotonic() - began < 5
        message = str(raised.value)
        assert f"invocations of {failing.url} fail: {said}" in message, message
        assert "retry" in message
        assert (await endpoint(client))["lastError"] == said
        await client.close()
    finally:
        await failing.stop()


async def test_a_start_against_a_port_where_nothing_listens_fails_soon_saying_so(cluster):
    url = f"http://127.0.0.1:{free_port()}/"
    serve(cluster, url)
    client = await cluster.client()
    began = time.monotonic()
    with pytest.raises(fusee.NoHolderError) as raised:
        await asyncio.wait_for(client.start("steps", "doomed", 1), 20)
    assert time.monotonic() - began < 5
    assert f"invocations of {url} fail: no answer: Cannot connect to host" in str(raised.value), raised.value
    await client.close()


# -- probes -----------------------------------------------------------------------------


async def test_a_call_probes_an_endpoint_in_backoff_and_is_served_at_once(cluster):
    """The server started before its function: its invocations failed and its backoff
    grew to seconds. Once the function is up, the first start is served within about a
    second, by a probe, not after the backoff."""
    cluster.start_handler()
    gate = Flaky(cluster.handler_port, 502, 10**9)  # the function, not up yet
    await gate.start()
    try:
        serve(cluster, gate.url)
        client = await cluster.client()
        backoff = await eventually(lambda: _backing_off(client, 2500), timeout=20, every=0.05)
        gate.left = 0  # the function is up
        began = time.monotonic()
        run = await client.start("steps", "first-start", 1)
        assert len(await run.result()) == 1
        took = time.monotonic() - began
        assert took < 1.5 and took < backoff["backoffMs"] / 1000 - 0.5, (took, backoff)
        assert (await quiet(client))["endpoints"][0]["succeeded"] >= 1
        await client.close()
    finally:
        await gate.stop()


async def _backing_off(client: fusee.Client, least_ms: int) -> dict[str, Any] | None:
    now = await endpoint(client)
    return now if now["backoffMs"] >= least_ms else None


async def test_calls_probe_an_endpoint_in_backoff_once_at_a_time_and_once_a_second(cluster):
    """Fifty calls at once, then calls one after another for 2 s, all for an endpoint that
    keeps failing and backs off: one probe in flight at a time, one a second at most."""
    failing = Flaky(cluster.handler_port, 500, 10**9)
    await failing.start()
    try:
        serve(cluster, failing.url)
        client = await cluster.client()
        await eventually(lambda: _backing_off(client, 2500), timeout=20, every=0.05)
        before = failing.seen
        began = time.monotonic()
        calls = [client.start("steps", f"probe-{i}", 1) for i in range(50)]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(a, fusee.NoHolderError) for a in answers), answers
        while time.monotonic() - began < 2.0:
            with pytest.raises(fusee.NoHolderError):
                await client.start("steps", "probe-again", 1)
        posts = failing.seen - before
        assert 1 <= posts <= 4, posts  # a probe a second (and the backoff's own retry, if it ends)
        await client.close()
    finally:
        await failing.stop()
