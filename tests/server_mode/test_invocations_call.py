"""The `invocations` call as docs/server.md (*Metrics*) writes it, `client.call("invocations",
{})`, its fields by their documented names, and calls the server cannot take: each gets an
error answer and the connection stays, against a real `fusee server` on loopback."""

from __future__ import annotations

import asyncio

import pytest

import fusee
import fusee.sync
from fusee.protocol import messages as m
from tests.support.procs import free_port

# Every Fusee server's names first, then this one's own (throttles, concurrency, lead,
# p50; scheduled and overdue shards).
ENDPOINT_FIELDS = [
    "url",
    "types",
    "invocations",
    "succeeded",
    "failed",
    "timedOut",
    "unleased",
    "inFlight",
    "failuresInARow",
    "backoffMs",
    "totalMs",
    "maxMs",
    "shards",
    "steps",
    "openUsTotal",
    "opens",
    "lastError",
    "throttled",
    "concurrency",
    "leadMs",
    "answerMsP50",
]
OVERALL_FIELDS = [
    "endpoints",
    "dueShards",
    "invokingShards",
    "backoffShards",
    "handbacks",
    "crashes",
    "noProgress",
    "parkedCalls",
    "scheduledShards",
    "overdue",
]


async def test_the_invocations_call_as_documented_without_endpoints(start_server):
    server = start_server()
    client = await fusee.Client.connect(server.address())
    assert await client.call("invocations", {}) == {"endpoints": []}
    await client.close()
    blocking = await asyncio.to_thread(fusee.sync.Client.connect, server.address())
    try:
        assert await asyncio.to_thread(blocking.call, "invocations", {}) == {"endpoints": []}
    finally:
        await asyncio.to_thread(blocking.close)


async def test_the_invocations_call_names_its_fields_as_documented(start_server):
    url = f"http://127.0.0.1:{free_port()}/"  # nothing listens: its invocations fail
    server = start_server("--invoke", url, "--invoke-types", "a,b")
    client = await fusee.Client.connect(server.address())
    got = await client.call("invocations", {})
    assert list(got) == OVERALL_FIELDS
    (endpoint,) = got["endpoints"]
    assert list(endpoint) == ENDPOINT_FIELDS
    assert (endpoint["url"], endpoint["types"]) == (url, ["a", "b"])
    # The shard and the arguments are not the call's business: any form is answered so.
    assert list(await client.call("invocations", 3, anything="at all")) == OVERALL_FIELDS
    await client.close()


async def test_a_malformed_call_is_answered_and_the_connection_stays(start_server):
    server = start_server()
    client = await fusee.Client.connect(server.address())
    conn = client.conn
    # A shard that is not a number: the frame does not decode as a call.
    answer = await client.link.request("invocations", {"not": "a shard"}, m.encode_value({}))  # type: ignore[arg-type]
    assert answer.code == "Rejected" and "a malformed call" in (answer.message or ""), answer
    # Only a listing goes to every holder: a start so would run on each.
    with pytest.raises(fusee.RejectedError, match="names no shard"):
        await client.call("start", -1, type="steps", id="x")
    with pytest.raises(fusee.RejectedError, match="the shard is a number"):
        await client.call("result", "x")  # type: ignore[arg-type]
    assert client.conn is conn and not conn.closed  # the same connection throughout
    assert await client.call("invocations", {}) == {"endpoints": []}
    await client.close()
