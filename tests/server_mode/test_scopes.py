"""Namespace tokens, the signed-in person as `by`, SIGHUP reloads and callback URLs
(docs/server.md, *Security*; docs/http-api.md, *Who may ask*, *Callbacks*), against a
real server and worker, over the binary protocol and HTTP alike."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import urllib.request
from pathlib import Path

import pytest

import fusee
from tests.support.http import Http
from tests.support.procs import Server
from tests.support.server_cli import base_url, token_file

ACME, GLOBEX = secrets.token_hex(32), secrets.token_hex(32)


def namespaces_file(dir: Path, text: str) -> str:
    path = dir / "namespaces"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


async def journal(api: Http, id: str) -> list[dict]:
    return (await api.ok("GET", f"/v1/runs/{id.replace('/', '%2F')}"))["journal"]


async def test_a_namespace_token_reaches_its_runs_only(start_server, start_worker, tmp_path):
    worker_file = token_file(tmp_path, "worker")
    names = namespaces_file(tmp_path, f"# namespace token\nacme {ACME}\n\nglobex  {GLOBEX}  # theirs\n")
    server = start_server("--token-file", worker_file, "--namespaces-file", names, "--http", "127.0.0.1:0")
    start_worker(server.address(token_file=worker_file))
    full = Path(worker_file).read_text().strip()
    async with Http(base_url(server), ACME) as api:
        await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "acme/h-1", "input": 1})
        status, _ = await api.request(
            "POST", "/v1/runs", {"type": "waiter", "id": "other", "input": 1}, token=full
        )
        assert status == 201
        info = await api.ok("GET", "/v1/info")
        assert (info["access"], info["namespace"]) == ("namespace", "acme")
        refused = [
            ("POST", "/v1/runs", {"type": "waiter", "id": "globex/h-1", "input": 1}),
            ("POST", "/v1/runs", {"type": "waiter", "id": "acme", "input": 1}),  # no '/': outside
            ("POST", "/v1/runs", {"type": "fusee.schedule", "id": "acme/s", "input": 1}),
            ("POST", "/v1/runs/other/signals/go", {"value": 1}),
            ("POST", "/v1/runs/other/cancel", {"reason": "no"}),
            ("GET", "/v1/runs/other", None),
            ("GET", "/v1/runs/other/result", None),
            ("GET", "/v1/runs?prefix=globex/", None),
            ("GET", "/v1/invocations", None),
            ("GET", "/metrics", None),
        ]
        for method, path, body in refused:
            status, error = await api.request(method, path, body)
            assert (status, error["code"]) == (403, "Rejected"), (method, path, error)
        for token in (GLOBEX[:-1], "nope"):  # not a token: 401
            assert (await api.request("GET", "/v1/runs", token=token))[0] == 401
        # The header means nothing without --identity-header: the token names who asked.
        status, _ = await api.request(
            "POST", "/v1/runs/acme%2Fh-1/signals/go", {"value": 5}, headers={"X-Forwarded-User": "mallory"}
        )
        assert status == 200
        assert (await api.ok("GET", "/v1/runs/acme%2Fh-1/result", wait="10000"))["result"] == [5]
        assert [row["id"] for row in (await api.ok("GET", "/v1/runs"))["runs"]] == ["acme/h-1"]
        assert [row["id"] for row in (await api.ok("GET", "/v1/runs", prefix="a"))["runs"]] == ["acme/h-1"]
        signals = [r for r in await journal(api, "acme/h-1") if r["kind"] == "SignalReceived"]
        assert [r["by"] for r in signals] == ["token:namespace:acme"]

        # The same scope on the binary protocol.
        globex_file = token_file(tmp_path, "globex", token=GLOBEX)
        client = await fusee.Client.connect(server.address(token_file=globex_file))
        try:
            run = await client.start("waiter", "globex/b-1", 1)
            for attempt in (
                client.start("waiter", "acme/b-1", 2),
                client.run("acme/h-1").status(),
                client.run("other").signal("go", 1),
                client.run("other").cancel("no"),
                client.call("invocations", {}),
            ):
                with pytest.raises(fusee.RejectedError, match="namespace 'globex'"):
                    await attempt
            await run.signal("go", 7)
            assert await run.result() == [7]
            assert [row.id async for row in client.list()] == ["globex/b-1"]
        finally:
            await client.close()
        # Nothing the refusals asked for was recorded.
        everything = await api.request("GET", "/v1/runs", token=full)
        assert sorted(row["id"] for row in everything[1]["runs"]) == ["acme/h-1", "globex/b-1", "other"]
        other = await api.request("GET", "/v1/runs/other", token=full)
        assert [
            r["kind"] for r in other[1]["journal"] if r["kind"] in ("SignalReceived", "CancelRequested")
        ] == []


async def test_a_broken_namespaces_file_stops_the_start(tmp_path):
    from tests.support.server_cli import start_fails

    worker_file = token_file(tmp_path, "worker")
    for text, says in (
        (f"acme {ACME} extra\n", "line 1: expected a namespace and its token"),
        ("acme short\n", "at least 16"),
        (f"a/b {ACME}\n", "no '/'"),
        (f"acme {ACME}\nacme {GLOBEX}\n", "given twice"),
    ):
        names = namespaces_file(tmp_path, text)
        output = start_fails(
            tmp_path / "d", "--listen", "127.0.0.1:0", "--token-file", worker_file, "--namespaces-file", names
        )
        assert says in output and "--namespaces-file" in output, output
    names = namespaces_file(tmp_path, f"acme {ACME}\n")
    assert "needs --token-file" in start_fails(
        tmp_path / "d", "--listen", "127.0.0.1:0", "--namespaces-file", names
    )


async def test_the_identity_header_names_who_asked(start_server, start_worker):
    server = start_server("--http", "127.0.0.1:0", "--identity-header", "X-Forwarded-User")
    start_worker(server.address())
    async with Http(base_url(server)) as api:
        status, error = await api.request("POST", "/v1/runs", {"type": "waiter", "id": "who-1", "input": 2})
        assert (status, error["code"]) == (401, "Rejected") and "X-Forwarded-User" in error["message"]
        ana = {"X-Forwarded-User": "ana@example.com"}
        for id in ("who-1", "who-2", "who-3"):
            status, _ = await api.request(
                "POST", "/v1/runs", {"type": "waiter", "id": id, "input": 2}, headers=ana
            )
            assert status == 201
        status, _ = await api.request("POST", "/v1/runs/who-1/signals/go", {"value": 1}, headers=ana)
        assert status == 200
        bob = {"X-Forwarded-User": "bob"}
        assert (await api.request("POST", "/v1/runs/who-1/signals/go", {"value": 2}, headers=bob))[0] == 200
        assert (await api.request("POST", "/v1/runs/who-2/cancel", {"reason": "x"}, headers=bob))[0] == 200
        assert (await api.request("POST", "/v1/runs/who-3/terminate", {}, headers=ana))[0] == 200
        records = (await api.request("GET", "/v1/runs/who-1", headers=ana))[1]["journal"]
        assert [r["by"] for r in records if r["kind"] == "SignalReceived"] == ["ana@example.com", "bob"]
        records = (await api.request("GET", "/v1/runs/who-2", headers=ana))[1]["journal"]
        assert [r["by"] for r in records if r["kind"] == "CancelRequested"] == ["bob"]
        records = (await api.request("GET", "/v1/runs/who-3", headers=ana))[1]["journal"]
        assert [(r["status"], r["by"]) for r in records if r["kind"] == "Finished"] == [
            ("terminated", "ana@example.com")
        ]
        status, _ = await api.request("GET", "/v1/info", headers={"X-Forwarded-User": "x" * 300})
        assert status == 400


async def reloaded(server: Server, mark: int, what: str) -> None:
    server.signal(signal.SIGHUP)
    await server.wait_for_async(what, start=mark)


async def test_sighup_reloads_tokens_for_new_connections(start_server, start_worker, tmp_path):
    worker_file = token_file(tmp_path, "worker")
    client_file = token_file(tmp_path, "client")
    names = namespaces_file(tmp_path, f"acme {ACME}\n")
    server = start_server(
        "--token-file", worker_file, "--client-token-file", client_file, "--namespaces-file", names,
        "--http", "127.0.0.1:0",
    )  # fmt: skip
    start_worker(server.address(token_file=worker_file))
    old = Path(client_file).read_text().strip()
    old_copy = token_file(tmp_path, "old-client", token=old)
    before = await fusee.Client.connect(server.address(token_file=old_copy))
    try:
        await before.start("waiter", "hup-1", 1)
        new = secrets.token_hex(32)
        Path(client_file).write_text(new + "\n")
        namespaces_file(tmp_path, f"globex {GLOBEX}\n")  # acme's token goes, globex's comes
        await reloaded(server, len(server.lines), "reloaded the token files")
        after = await fusee.Client.connect(server.address(token_file=client_file))
        await after.start("waiter", "hup-2", 1)
        await after.close()
        with pytest.raises(fusee.ConnectionError, match="does not match"):
            await fusee.Client.connect(server.address(token_file=old_copy))
        await before.run("hup-1").signal("go", 3)  # made before: it keeps its token's grant
        assert await before.run("hup-1").result() == [3]
        async with Http(base_url(server)) as api:
            assert (await api.request("GET", "/v1/runs", token=old))[0] == 401
            assert (await api.request("GET", "/v1/runs", token=ACME))[0] == 401
            assert (await api.request("GET", "/v1/runs", token=new))[0] == 200
            assert (await api.request("GET", "/v1/runs", token=GLOBEX))[0] == 200

            # A file that does not load: the old settings stay, the log names the file.
            Path(client_file).write_text("short\n")
            await reloaded(server, len(server.lines), rf"keeping the settings in use.*{client_file}")
            assert (await api.request("GET", "/v1/runs", token=new))[0] == 200
            namespaces_file(tmp_path, "globex\n")
            Path(client_file).write_text(new + "\n")
            await reloaded(server, len(server.lines), rf"keeping the settings in use.*{names}")
            assert (await api.request("GET", "/v1/runs", token=GLOBEX))[0] == 200
        again = await fusee.Client.connect(server.address(token_file=client_file))
        await again.close()
    finally:
        await before.close()


def _post(url: str, value: object) -> tuple[int, dict]:
    """A plain HTTP client: no fusee, no aiohttp."""
    request = urllib.request.Request(
        url, data=json.dumps(value).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, json.loads(answer.read())


async def _written(path: Path) -> str:
    for _ in range(400):
        if path.exists() and path.read_text():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never written")


async def test_cb_url_completes_a_waiting_run(start_server, start_worker, tmp_path):
    server = start_server("--http", "127.0.0.1:0")
    steps = tmp_path / "steps"
    start_worker(server.address(), steps_file=steps)
    base = base_url(server)
    async with Http(base) as api:
        await api.ok("POST", "/v1/runs", {"type": "awaiting", "id": "cb-1", "input": 0})
        await _written(steps.with_name("steps.cb-1.token"))
        url = steps.with_name("steps.cb-1.url").read_text()
        assert url.startswith(f"{base}/v1/complete/"), url
        status, done = await asyncio.to_thread(_post, url, {"approved": True})
        assert (status, done["id"]) == (200, "cb-1")
        result = await api.ok("GET", "/v1/runs/cb-1/result", wait="10000")
        assert result["result"] == {"approved": True}


async def test_public_url_names_the_base(start_server, start_worker, tmp_path):
    server = start_server("--http", "127.0.0.1:0", "--public-url", "https://fusee.example/api/")
    steps = tmp_path / "steps"
    start_worker(server.address(), steps_file=steps)
    async with Http(base_url(server)) as api:
        await api.ok("POST", "/v1/runs", {"type": "awaiting", "id": "cb-2", "input": 0})
        token = await _written(steps.with_name("steps.cb-2.token"))
        assert (
            steps.with_name("steps.cb-2.url").read_text() == f"https://fusee.example/api/v1/complete/{token}"
        )


async def test_an_engine_hands_out_its_own_url(tmp_path, monkeypatch):
    from tests.server_mode.flows import WORKFLOWS

    steps = tmp_path / "steps"
    monkeypatch.setenv("FUSEE_TEST_STEPS", str(steps))
    async with await fusee.Engine.open(workflows=WORKFLOWS) as engine:
        site = await engine.serve("127.0.0.1:0")
        try:
            run = await engine.start("awaiting", "e-1", 0)
            await _written(steps.with_name("steps.e-1.token"))
            url = steps.with_name("steps.e-1.url").read_text()
            assert url.startswith(f"{site.url}/v1/complete/"), url
            assert (await asyncio.to_thread(_post, url, [1, 2]))[0] == 200
            assert await run.result() == [1, 2]
        finally:
            await site.close()
        # Behind a proxy: its address wins over the site's.
        engine.set_callback_url("https://proxy.example/f/")
        assert engine.callback_url("t.t") == "https://proxy.example/f/v1/complete/t.t"
        with pytest.raises(fusee.RejectedError, match="http"):
            engine.set_callback_url("proxy.example")
    async with await fusee.Engine.open(workflows=WORKFLOWS) as engine:
        assert engine.callback_url("t.t") is None  # no API known: cb.url is None


async def test_sighup_reloads_the_tls_certificate(start_server, tmp_path):
    from tests.server_mode import certs
    from tests.server_mode.test_security import assert_serving, refused

    old, new = certs.make(tmp_path / "old"), certs.make(tmp_path / "new")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_text(Path(old.server.cert).read_text())
    key.write_text(Path(old.server.key).read_text())
    key.chmod(0o600)
    worker_file = token_file(tmp_path, "worker")
    server = start_server("--token-file", worker_file, "--tls-cert", str(cert), "--tls-key", str(key))
    before = await fusee.Client.connect(server.address(ca=old.ca, token_file=worker_file))
    try:
        cert.write_text(Path(new.server.cert).read_text())
        key.write_text(Path(new.server.key).read_text())
        await reloaded(server, len(server.lines), "and the TLS certificate")
        await assert_serving(server, ca=new.ca, token_file=worker_file)  # the token's binding: the new cert
        assert "ca=" in await refused(server.address(ca=old.ca, token_file=worker_file))
        with pytest.raises(fusee.NoHolderError):  # made before: still served
            await anext(before.list())
        key.write_text(Path(old.server.key).read_text())  # not the certificate's key
        await reloaded(server, len(server.lines), r"keeping the settings in use.*--tls")
        await assert_serving(server, ca=new.ca, token_file=worker_file)
    finally:
        await before.close()
