"""`fusee server ...`: its options, its start (refused with the setting named when a
setting is wrong, before anything is opened), its listeners and its clean stop on
SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path

from fusee._errors import FuseeError
from fusee.protocol import handshake
from fusee_server import invoke_config
from fusee_server.http_api import HttpApi
from fusee_server.invoker import Invoker
from fusee_server.listener import ServerConnection, server_tls
from fusee_server.server import Server

logger = logging.getLogger("fusee.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True, help="the server's data directory")
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="TCP address to listen on (port 0: any free port, printed)"
    )
    parser.add_argument("--unix", metavar="PATH", help="a Unix socket to listen on too")
    parser.add_argument("--shards", type=int, help="shards of a new directory (default 4)")
    parser.add_argument("--token-file", metavar="PATH", help="require this shared token from every peer")
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="TLS 1.3: the certificate chain this server presents"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="TLS 1.3: its private key")
    parser.add_argument(
        "--tls-ca", metavar="PEM", help="require client certificates signed by this CA (mutual TLS)"
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus) and /healthz over HTTP here (port 0: any free port, printed)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    invoke_config.add_arguments(parser)


class SettingError(Exception):
    """A wrong setting: the message names it."""


def _host_port(text: str, option: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingError(f"{option} {text!r}: expected HOST:PORT, a port from 0 to 65535")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(args: argparse.Namespace) -> int:
    if args.listen is None and args.unix is None:
        raise SettingError("give --listen HOST:PORT, --unix PATH, or both")
    if args.shards is not None and args.shards < 1:
        raise SettingError(f"--shards {args.shards}: need at least 1")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SettingError("--tls-cert and --tls-key go together")
    if args.tls_ca is not None and args.tls_cert is None:
        raise SettingError("--tls-ca needs --tls-cert and --tls-key (mutual TLS is TLS)")
    listen = _host_port(args.listen, "--listen") if args.listen is not None else None
    http = _host_port(args.http, "--http") if args.http is not None else None
    try:
        endpoints = invoke_config.endpoints(args)
    except invoke_config.ConfigError as error:
        raise SettingError(str(error)) from None
    token = None
    if args.token_file is not None:
        try:
            token, readable = handshake.read_token(args.token_file)
        except FuseeError as error:
            raise SettingError(f"--token-file: {error}") from None
        if readable:
            logger.warning("--token-file %s can be read by other users (chmod 600 it)", args.token_file)
    tls = None
    binding = b""
    if args.tls_cert is not None:
        try:
            tls, binding = server_tls(args.tls_cert, args.tls_key, args.tls_ca)
        except (OSError, ValueError) as error:
            raise SettingError(f"--tls-cert/--tls-key/--tls-ca: {error}") from None
    if listen is not None and not _loopback(listen[0]) and token is None and tls is None:
        logger.warning(
            "listening on %s without a token or TLS: anyone who reaches it can take leases "
            "(add --token-file, --tls-cert/--tls-key)",
            listen[0],
        )
    if http is not None and not _loopback(http[0]):
        if token is None:
            logger.warning(
                "--http %s without a token: anyone who reaches it can read the metrics (add --token-file)",
                http[0],
            )
        elif tls is None:
            # The bearer token is the one workers prove: sent in clear, it lets whoever
            # reads it off the network take leases.
            logger.warning(
                "--http %s without TLS: the token crosses the network in clear (add --tls-cert/--tls-key)",
                http[0],
            )
    server = await Server.open(str(args.dir), args.shards)
    loop = asyncio.get_running_loop()

    def plain() -> ServerConnection:
        return ServerConnection(server, token, b"")

    def secured() -> ServerConnection:
        return ServerConnection(server, token, binding)

    try:
        if listen is not None:
            tcp = await loop.create_server(
                secured if tls is not None else plain,
                listen[0],
                listen[1],
                ssl=tls,
                ssl_handshake_timeout=handshake.DEADLINE_S if tls is not None else None,
            )
            server.listeners.append(tcp)
            port = tcp.sockets[0].getsockname()[1]
            print(f"fusee server: listening on {listen[0]}:{port}", file=sys.stderr, flush=True)
        if args.unix is not None:
            Path(args.unix).unlink(missing_ok=True)
            server.listeners.append(await loop.create_unix_server(plain, args.unix))
            print(f"fusee server: listening on unix:{args.unix}", file=sys.stderr, flush=True)
    except OSError as error:
        await server.stop()
        raise SettingError(f"--listen/--unix: {error.strerror or error}") from None
    api = None
    if http is not None:
        api = HttpApi(server, token)
        try:
            port = await api.start(http[0], http[1], tls)
        except OSError as error:
            await api.close()
            await server.stop()
            # asyncio wraps the bind's error in a long message; its errno says it shortly.
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise SettingError(f"--http {args.http}: {reason}") from None
        host = f"[{http[0]}]" if ":" in http[0] else http[0]
        scheme = "https" if tls is not None else "http"
        print(f"fusee server: metrics on {scheme}://{host}:{port}/metrics", file=sys.stderr, flush=True)
    print(f"fusee server: {server.shards} shards in {args.dir}, ready", file=sys.stderr, flush=True)
    server.start()
    if endpoints:
        server.invoker = Invoker(server, endpoints)
        if api is not None:
            api.metrics.watch(server.invoker)
        server.invoker.start()
        for endpoint in endpoints:
            print(f"fusee server: invoking {endpoint.url}", file=sys.stderr, flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stopped.set)
    await server.stopped.wait()
    logger.info("stopping: releasing every lease, closing the log")
    try:
        await server.stop()
    finally:
        if api is not None:
            await api.close()  # after the stop: /healthz answers 503 while it runs
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return asyncio.run(serve(args))
    except SettingError as error:
        print(f"fusee server: {error}", file=sys.stderr)
        return 2
    except FuseeError as error:
        print(f"fusee server: {error}", file=sys.stderr)
        return 2
