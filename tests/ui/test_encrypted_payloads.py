"""Encrypted payloads in the web UI (docs/web-ui.md, *Encrypted payloads*): a worker with
`fusee.aes_gcm` keys, so the server holds ciphertext only and its pages show payloads as
*encrypted*; with `--codec-url` naming a `fusee codec-server` that holds the keys, the
browser has them decoded there and shows the values. Real processes and Debian's
chromium; the codec endpoint refuses a page of another origin."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import quote

from tests.support.http import Http
from tests.support.procs import Proc, free_port
from tests.support.server_cli import base_url

MARKER = "ui-secret-5d1e"
KEY = os.urandom(32)


class CodecServer(Proc):
    def __init__(self, keys: Path, origin: str, port: int) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "fusee",
                "codec-server",
                "--keys-file",
                str(keys),
                "--allow-origin",
                origin,
                "--listen",
                f"127.0.0.1:{port}",
            ],
            {},
        )
        self.wait_for(r"listening on 127\.0\.0\.1:\d+")


async def _secret_run(url: str) -> None:
    async with Http(url) as api:
        status, _ = await api.post("/v1/runs", {"type": "secret", "id": "sec-1", "input": MARKER})
        assert status in (200, 201), status
        for _ in range(200):  # until it waits for its signal: the step and the child done
            status, body = await api.get("/v1/runs/sec-1")
            if status == 200 and any(r.get("kind") == "WaitStarted" for r in body.get("journal", [])):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the run never waited for its signal: {body}")


async def test_pages_show_encrypted_payloads_decoded_only_through_the_codec_endpoint(
    procs: list[Proc], start_server, start_worker, browser, tmp_path: Path
):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"k1 {KEY.hex()}\n")
    http_port, codec_port = free_port(), free_port()
    origin = f"http://127.0.0.1:{http_port}"
    procs.append(CodecServer(keys, origin, codec_port))
    server = start_server("--http", f"127.0.0.1:{http_port}", "--codec-url", f"http://127.0.0.1:{codec_port}")
    start_worker(server.address(), env={"FUSEE_TEST_KEYS": f"k1={KEY.hex()}"})
    url = base_url(server)
    await _secret_run(url)

    # The API answers the sealed bytes: the server has no key.
    async with Http(url) as api:
        _, described = await api.get("/v1/runs/sec-1")
    step = next(r for r in described["journal"] if r["kind"] == "StepDone")
    assert set(step["value"]) == {"$encoded"} and MARKER not in str(described)

    context = await browser.new_context()
    page = await context.new_page()
    page.set_default_timeout(15_000)
    await page.goto(f"{url}/runs/{quote('sec-1', safe='')}")
    await page.wait_for_selector("pre.decoded")
    text = await page.inner_text("#live")
    assert f'"{MARKER}-step"' in text and f'"{MARKER}"' in text  # the step's result and the input
    assert "encrypted" not in await page.inner_text("#input")
    await context.close()

    # The same page served without a codec endpoint keeps them encrypted.
    plain = start_server("--http", "127.0.0.1:0", dir=tmp_path / "second")
    start_worker(plain.address(), env={"FUSEE_TEST_KEYS": f"k1={KEY.hex()}"})
    second = base_url(plain)
    await _secret_run(second)
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(f"{second}/runs/sec-1")
    await page.wait_for_selector("#input")
    assert (await page.inner_text("#input")).strip() == "encrypted"
    assert MARKER not in await page.content()
    await context.close()

    # The endpoint answers only its allowed origin.
    async with Http(f"http://127.0.0.1:{codec_port}") as codec:
        status, _ = await codec.post("/decode", {"payloads": []}, headers={"Origin": "http://evil.example"})
        assert status == 403
        status, body = await codec.post(
            "/decode", {"payloads": ["bm90IHNlYWxlZA==", 3]}, headers={"Origin": origin}
        )
        assert status == 200 and body == {"payloads": [None, None]}
