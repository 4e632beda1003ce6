"""The three tokens of a real `fusee server`, each checked on its own paths: the worker
token (`--token-file`) holds shards and reaches everything; a client token
(`--client-token-file`) makes any call but may not hold a shard; a read token
(`--read-token-file`) makes only calls that read and scrapes `/metrics`, so a scrape
config never holds a credential that can lease shards."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import fusee
from fusee.protocol import messages as m
from fusee.protocol.address import parse
from fusee.protocol.connection import connect
from tests.support.procs import Server
from tests.support.server_cli import base_url, get, start_fails, token_file


@fusee.workflow("tokens-echo")
async def echo(ctx: fusee.Ctx, value: str) -> str:
    return await ctx.step("echo", lambda: value)


class Tokens:
    def __init__(self, dir: Path) -> None:
        self.worker = token_file(dir, "worker-token")
        self.client = token_file(dir, "client-token")
        self.read = token_file(dir, "read-token")

    def options(self) -> tuple[str, ...]:
        return (
            "--token-file",
            self.worker,
            "--client-token-file",
            self.client,
            "--read-token-file",
            self.read,
        )

    def bearer(self, path: str) -> str:
        return Path(path).read_text().strip()


class Ignore:
    def on_message(self, message: Any) -> None:
        pass

    def on_lost(self, error: fusee.ConnectionError) -> None:
        pass


async def open_as(server: Server, token: str, role: str, invocation: str | None = None) -> str | None:
    """Connect with `token` under `role`; the refusal's message, or None if let in."""
    session = b"x" * 16 if role == m.ROLE_PINGER else b""
    opening = m.Open(m.VERSION, role, invocation=invocation, liveness=False, session=session)
    try:
        conn, _ = await connect(parse(server.address(token_file=token)), opening, Ignore())
    except fusee.ConnectionError as error:
        return str(error)
    await conn.aclose()
    return None


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return Tokens(tmp_path)


async def test_each_token_reaches_what_its_scope_allows(start_server, tokens):
    server = start_server(*tokens.options(), "--http", "127.0.0.1:0")
    worker = await fusee.Engine.open(
        durability="server", address=server.address(token_file=tokens.worker), workflows=[echo]
    )
    client = await fusee.Client.connect(server.address(token_file=tokens.client))
    reader = await fusee.Client.connect(server.address(token_file=tokens.read))
    try:
        run = await client.start(echo, "echo-1", "hi")  # a client token starts, signals, ...
        assert await run.result() == "hi"
        assert await reader.run("echo-1").result() == "hi"  # ... a read token reads
        assert [row.id async for row in reader.list()] == ["echo-1"]
        for change in (
            reader.start(echo, "echo-2", "no"),
            reader.run("echo-1").cancel(),
            reader.run("echo-1").signal("go", 1),
        ):
            with pytest.raises(fusee.RejectedError, match="read token"):
                await change
        assert [row.id async for row in reader.list()] == ["echo-1"]  # nothing was started
    finally:
        await reader.close()
        await client.close()
        await worker.close()
    url = base_url(server) + "/metrics"
    for path in (tokens.worker, tokens.client, tokens.read):
        status, _, body = await get(url, tokens.bearer(path))
        assert status == 200 and "fusee_shards" in body, (path, status)
    assert (await get(url, "not-a-token-of-this-server"))[0] == 401
    async with aiohttp.ClientSession() as session:
        for path, status in ((tokens.read, 403), (tokens.worker, 405)):  # a change: refused to a reader
            headers = {"Authorization": f"Bearer {tokens.bearer(path)}"}
            async with session.post(url, headers=headers, json={}) as response:
                assert response.status == status, path


@pytest.mark.parametrize("which", ["client", "read", "namespace"])
async def test_a_client_or_read_token_cannot_hold_shards(start_server, tokens, which, tmp_path):
    options = list(tokens.options())
    if which == "namespace":
        secret = "acme-token-0123456789abcdef0123"
        (tmp_path / "namespaces").write_text(f"acme {secret}\n")
        options += ["--namespaces-file", str(tmp_path / "namespaces")]
        token = str(tmp_path / "acme")
        (tmp_path / "acme").write_text(secret)
    else:
        token = getattr(tokens, which)
    server = start_server(*options)
    for role in (m.ROLE_WORKER, m.ROLE_PINGER):
        refusal = await open_as(server, token, role)
        assert refusal is not None and "may not hold shards" in refusal, (role, refusal)
        assert "--token-file" in refusal and ("--namespaces-file" in refusal) == (which == "namespace")
    refusal = await open_as(server, token, m.ROLE_CLIENT, invocation="inv-1")  # an invoked worker's OPEN
    assert refusal is not None and "may not hold shards" in refusal
    assert await open_as(server, token, m.ROLE_CLIENT) is None
    assert await open_as(server, tokens.worker, m.ROLE_WORKER) is None  # the worker token still does


@pytest.mark.parametrize("which", ["client", "read"])
async def test_a_client_or_read_token_sending_a_workers_frame_is_closed(start_server, tokens, which):
    """A relayed message is a worker's to send: a client that could would write into any
    run's inbox without the worker token."""
    server = start_server(*tokens.options())
    conn, _ = await connect(
        parse(server.address(token_file=getattr(tokens, which))),
        m.Open(m.VERSION, m.ROLE_CLIENT, liveness=False),
        Ignore(),
    )
    try:
        conn.send(m.Relay(0, False, b"\x90"))
        async with asyncio.timeout(5):
            await conn.lost
    finally:
        await conn.aclose()
    server.wait_for(r"Relay is not a frame a (client|read)-token peer sends")


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda t: ("--client-token-file", t.client), "--client-token-file needs --token-file"),
        (lambda t: ("--read-token-file", t.read), "--read-token-file needs --token-file"),
        (lambda t: ("--token-file", t.worker, "--client-token-file", t.worker), "--client-token-file"),
        (lambda t: ("--token-file", t.worker, "--read-token-file", t.worker), "--read-token-file"),
        (lambda t: ("--token-file", t.worker, "--read-token-file", "/nonexistent"), "--read-token-file"),
    ],
    ids=["client-alone", "read-alone", "client-is-worker", "read-is-worker", "read-missing"],
)
def test_a_wrong_token_setting_fails_the_start_naming_it(tmp_path, tokens, build, named):
    output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", *build(tokens))
    assert named in output, output
