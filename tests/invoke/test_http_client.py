"""The invoker's HTTP client (server/fusee_server/http_client.py) against real peers on
loopback: aiohttp's web server for keep-alive, and raw asyncio servers for the answers an
ordinary framework does not give (chunked, to the connection's end, an interim 100)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from fusee_server.http_client import HttpClient, HttpError

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _raw(serve: Serve) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/invoke?x=1"


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request, whole (head and Content-Length body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


@pytest.fixture
async def keep_alive() -> AsyncIterator[tuple[str, list[str]]]:
    """An aiohttp app that answers each POST with the peer's address, and closes idle
    kept-alive connections after 0.2 s."""
    peers: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        peers.append(str(request.transport.get_extra_info("peername") if request.transport else None))
        return web.json_response({"body": (await request.read()).decode()})

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, keepalive_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/", peers
    await runner.cleanup()


async def test_a_kept_alive_connection_is_reused_and_one_the_peer_closed_is_not(
    keep_alive: tuple[str, list[str]],
) -> None:
    url, peers = keep_alive
    client = HttpClient(url, None)
    first = await client.post({"content-type": "application/json"}, b"one", 5)
    second = await client.post({"content-type": "application/json"}, b"two", 5)
    assert (first.status, first.detail) == (200, '{"body": "one"}')
    assert second.detail == '{"body": "two"}'
    assert peers[0] == peers[1]  # one connection, kept
    await asyncio.sleep(0.5)  # the peer closes it meanwhile: not reused, no failure
    third = await client.post({}, b"three", 5)
    assert third.status == 200 and peers[2] != peers[0]
    client.close()


async def test_chunked_close_delimited_and_interim_answers_are_read_whole() -> None:
    answers = iter(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nslow",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\n",
            b"HTTP/1.0 302 Found\r\nLocation: http://elsewhere/\r\n\r\nto the end",
        ]
    )
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            requests.append(await _request(reader))
            writer.write(answer)
            if answer.startswith(b"HTTP/1.0"):
                break  # its body runs to the connection's end
        writer.close()

    server, url = await _raw(serve)
    client = HttpClient(url, None)
    throttled = await client.post({"fusee-signature": "t=1,v1=ab"}, b"{}", 5)
    assert (throttled.status, throttled.retry_after, throttled.detail) == (429, "3", "slow")
    chunked = await client.post({}, b"{}", 5)
    assert (chunked.status, chunked.detail) == (200, "hello world")
    moved = await client.post({}, b"{}", 5)
    assert (moved.status, moved.location, moved.detail) == (302, "http://elsewhere/", "to the end")
    assert requests[0].startswith(b"POST /invoke?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\nfusee-signature: t=1,v1=ab\r\ncontent-length: 2\r\n\r\n{}" in requests[0]
    assert len(requests) == 3  # all three on one connection, kept until the HTTP/1.0 answer
    assert client.idle == []  # ... which is not kept
    server.close()
    client.close()


async def test_a_peer_that_closes_before_answering_or_answers_garbage_fails_the_post() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"SMTP ready\r\n")
        writer.close()

    server, url = await _raw(serve)
    client = HttpClient(url, None)
    with pytest.raises(HttpError, match=r"not an HTTP/1\.x response"):
        await client.post({}, b"{}", 5)
    server.close()
    with pytest.raises(HttpError, match="Cannot connect to host"):
        await client.post({}, b"{}", 5)
    assert client.idle == []
