"""`fusee codec-server`: decodes encrypted payloads for the web UI, where the keys are.

The UI of a server whose workers encrypt (`codec=fusee.aes_gcm(keys)`) shows payloads as
*encrypted*: the server holds no key. Started where the keys are, this endpoint answers
`POST /decode` with `{"payloads": [base64, ...]}` by the decoded values (`null` for one it
cannot decode); the browser calls it directly, so neither the keys nor the plain payloads
reach the Fusee server. Only pages of `--allow-origin` may call it (CORS), and it listens
on loopback unless `--insecure` says a proxy in front signs people in
(docs/web-ui.md, *Encrypted payloads*).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from fusee import _codec as codec
from fusee._errors import CodecError, FuseeError, SettingError
from fusee._sealing import AesGcm, aes_gcm, keys_file
from fusee_server.http_guard import is_loopback

PAYLOADS_MAX = 1000  # per request: a page of the UI shows far fewer
BODY_MAX = 16 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys-file", type=Path, required=True, help="lines of '<key ID> <64 hex digits>'")
    parser.add_argument(
        "--allow-origin",
        action="append",
        required=True,
        help="the origin of the UI's pages (https://fusee.example.com); repeat for several",
    )
    parser.add_argument("--listen", default="127.0.0.1:7602", help="HOST:PORT (default 127.0.0.1:7602)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback: only behind a proxy that signs people in",
    )


def settings(args: argparse.Namespace) -> tuple[AesGcm, list[str], str, int]:
    """The keys, origins and address, or SettingError naming the option."""
    try:
        keys = aes_gcm(keys_file(args.keys_file.read_text(), f"--keys-file {args.keys_file}"))
    except OSError as error:
        raise SettingError(f"--keys-file {args.keys_file}: {error.strerror or error}") from None
    except FuseeError as error:
        raise SettingError(error.message) from None
    origins = []
    for origin in args.allow_origin:
        origin = origin.rstrip("/")
        if not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
            raise SettingError(f"--allow-origin {origin}: an origin is scheme://host[:port], no path")
        origins.append(origin)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise SettingError(f"--listen {args.listen}: expected HOST:PORT")
    if not args.insecure and not is_loopback(host):
        raise SettingError(
            f"--listen {args.listen}: not a loopback address; anyone reaching it could decode "
            "payloads. Put it behind a proxy that signs people in and pass --insecure"
        )
    return keys, origins, host, int(port)


def app(keys: AesGcm, origins: list[str]) -> web.Application:
    async def decode(request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin not in origins:
            return web.json_response({"error": f"origin {origin!r} is not allowed"}, status=403)
        cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if request.method == "OPTIONS":
            cors["Access-Control-Allow-Methods"] = "POST"
            cors["Access-Control-Allow-Headers"] = "Content-Type"
            cors["Access-Control-Max-Age"] = "600"
            return web.Response(status=204, headers=cors)
        try:
            body = msgspec.json.decode(await request.read())
            payloads = body["payloads"]
            if not isinstance(payloads, list) or len(payloads) > PAYLOADS_MAX:
                raise ValueError
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            return web.json_response(
                {"error": f'expected {{"payloads": [base64, ...]}} (at most {PAYLOADS_MAX})'},
                status=400,
                headers=cors,
            )
        return web.json_response({"payloads": [_decoded(keys, p) for p in payloads]}, headers=cors)

    application = web.Application(client_max_size=BODY_MAX)
    application.router.add_route("POST", "/decode", decode)
    application.router.add_route("OPTIONS", "/decode", decode)
    return application


def _decoded(keys: AesGcm, payload: Any) -> Any:
    """One payload's value, or None when it cannot be decoded here (not base64, another
    key, damaged)."""
    if not isinstance(payload, str):
        return None
    try:
        value = codec.decode(keys.open(base64.b64decode(payload, validate=True)))
    except (binascii.Error, ValueError, CodecError):
        return None
    return {"$bytes": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fusee codec-server", description="Decode encrypted payloads for the web UI.", allow_abbrev=False
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        keys, origins, host, port = settings(args)
    except SettingError as error:
        print(f"fusee codec-server: {error}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(app(keys, origins), host, port))


async def _serve(application: web.Application, host: str, port: int) -> int:
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as error:
        print(
            f"fusee codec-server: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr
        )
        await runner.cleanup()
        return 2
    bound = runner.addresses[0]
    print(f"fusee codec-server: listening on {bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0
