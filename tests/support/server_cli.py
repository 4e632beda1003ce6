"""The server's command line and HTTP API as the tests use them: a start that must fail,
a token file, the endpoints `--invoke` options make, a GET on the HTTP API."""

from __future__ import annotations

import argparse
import os
import re
import secrets
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
from fusee_server import endpoints as endpoint_settings

from tests.support.procs import ROOT, Server


def start_fails(dir: Path, *args: str) -> str:
    """`fusee server --dir dir` with `args` exits 2 before serving; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "fusee", "server", "--dir", str(dir), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    # No "ready" ("already in use" names why it failed), no HTTP served, no crash.
    assert not re.search(r"(?<!al)ready", output), output
    assert "metrics on" not in output and "Traceback" not in output, output
    return output


def token_file(dir: Path, name: str = "token", mode: int = 0o600, token: str | None = None) -> str:
    path = dir / name
    path.write_text((token or secrets.token_hex(32)) + "\n")
    path.chmod(mode)
    return str(path)


def endpoints(*argv: str) -> list[endpoint_settings.Endpoint]:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    endpoint_settings.add_arguments(parser)
    return endpoint_settings.from_args(parser.parse_args(list(argv)))


def base_url(server: Server) -> str:
    """Where the server says it serves HTTP (its start line), without the path."""
    found = server.wait_for(r"metrics on (https?://\S+)/metrics")
    return found.group(1).replace("0.0.0.0", "127.0.0.1")


async def get(
    url: str, token: str | None = None, tls: ssl.SSLContext | None = None
) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers, ssl=tls if tls is not None else True) as response:
            return response.status, dict(response.headers), await response.text()
