"""`fusee server ...`: its options, its start (refused with the setting named when a
setting is wrong, before anything is opened), its listeners and its clean stop on
SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import re
import signal
import socket
import stat
import sys
from pathlib import Path

from fusee._errors import FuseeError, IoError, RejectedError, SettingError
from fusee.protocol import handshake
from fusee_server import endpoints
from fusee_server.http_api import HttpApi
from fusee_server.invoker import Invoker
from fusee_server.listener import ServerConnection
from fusee_server.postgres import database
from fusee_server.postgres.database import check_url
from fusee_server.postgres.ownership import Ownership, wait_to_own
from fusee_server.postgres.store import PgStore
from fusee_server.security import Security
from fusee_server.server import Server

logger = logging.getLogger("fusee.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="the server's data directory (one server, on this disk)")
    parser.add_argument(
        "--store",
        metavar="URL",
        help="postgresql://USER@HOST[:PORT]/DATABASE: keep every shard in PostgreSQL instead, shared by "
        "any number of servers, one owning the shards and the others standing by (docs/postgresql.md)",
    )
    parser.add_argument(
        "--backup",
        metavar="URL",
        help="back the directory up continuously to s3://bucket/prefix[?region=...&endpoint=...] or a "
        "directory (docs/backup.md)",
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="TCP address to listen on (port 0: any free port, printed)"
    )
    parser.add_argument("--unix", metavar="PATH", help="a Unix socket to listen on too")
    parser.add_argument(
        "--unix-mode",
        metavar="OCTAL",
        default="600",
        help="the Unix socket's permissions: who on this host may connect (default 600: this user)",
    )
    parser.add_argument("--shards", type=int, help="shards of a new directory (default 4)")
    parser.add_argument("--token-file", metavar="PATH", help="require this shared token from every peer")
    parser.add_argument(
        "--client-token-file",
        metavar="PATH",
        help="a token for clients: any call, but no shard held (needs --token-file)",
    )
    parser.add_argument(
        "--read-token-file",
        metavar="PATH",
        help="a token for readers: calls that read, /metrics (needs --token-file)",
    )
    parser.add_argument(
        "--namespaces-file",
        metavar="PATH",
        help="namespace tokens: each line 'NAMESPACE TOKEN', reaching runs whose ID starts with "
        "NAMESPACE/ (needs --token-file)",
    )
    parser.add_argument(
        "--identity-header",
        metavar="NAME",
        help="behind a proxy that signs people in: this HTTP header names who asks (kept as `by`)",
    )
    parser.add_argument(
        "--codec-url",
        metavar="URL",
        help="a codec endpoint (fusee codec-server) the web UI's pages ask to decode encrypted "
        "payloads; the keys and the plain payloads never reach this server",
    )
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="where the HTTP API is reached from outside: the base of the callback URLs (cb.url) "
        "workers hand out (default: the --http address, unless it is a wildcard)",
    )
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
    endpoints.add_arguments(parser)


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


def _warn_exposed(
    listen: tuple[str, int] | None, http: tuple[str, int] | None, token: bool, tls: bool
) -> None:
    """Warnings for what is reachable off loopback with less protection than it needs."""
    if listen is not None and not _loopback(listen[0]):
        if not token and not tls:
            logger.warning(
                "listening on %s without a token or TLS: anyone who reaches it can take leases "
                "(add --token-file, --tls-cert/--tls-key)",
                listen[0],
            )
        elif not tls:
            # The exchange proves the token without sending it, but the frames after it
            # carry only a CRC: whoever is on the path can inject frames or take the
            # authenticated connection over, leases included.
            logger.warning(
                "listening on %s with a token but no TLS: the frames after the token exchange are "
                "not protected, so whoever is on the network path can take a connection over "
                "(add --tls-cert/--tls-key)",
                listen[0],
            )
    if http is not None and not _loopback(http[0]):
        if not token:
            logger.warning(
                "--http %s without a token: anyone who reaches it can read the metrics (add --token-file)",
                http[0],
            )
        elif not tls:
            # A bearer crosses the network in clear; if it is the worker token, whoever
            # reads it can take leases.
            logger.warning(
                "--http %s without TLS: bearer tokens cross the network in clear (add --tls-cert/--tls-key, "
                "and give scrapers the --read-token-file token, not the worker token)",
                http[0],
            )


def _codec_url(given: str | None) -> str | None:
    if given is None:
        return None
    url = given.rstrip("/")
    if not url.startswith(("http://", "https://")) or any(c in url for c in " '\";"):
        raise SettingError(f"--codec-url {given}: expected an http:// or https:// URL")
    return url


def _check_backup(url: str) -> None:
    """A target URL that cannot work fails the start, naming the setting."""
    from fusee_server.backup.targets import target

    try:
        target(url)
    except RejectedError as error:
        raise SettingError(f"--backup {url}: {error}") from None


def _public_url(given: str | None, http: tuple[str, int] | None, tls: bool) -> str | None:
    """The base of callback URLs: --public-url, else the --http address when it names
    one host (a wildcard names none a caller could use; port 0 is not known yet)."""
    if given is not None:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", given):
            raise SettingError(f"--public-url {given!r}: expected http(s)://HOST[:PORT][/PATH]")
        return given.rstrip("/")
    if http is None or http[1] == 0 or http[0] in ("0.0.0.0", "::"):
        return None
    host = f"[{http[0]}]" if ":" in http[0] else http[0]
    return f"{'https' if tls else 'http'}://{host}:{http[1]}"


def _unix_mode(text: str) -> int:
    digits = text.removeprefix("0o")
    mode = int(digits, 8) if digits and len(digits) <= 4 and set(digits) <= set("01234567") else -1
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        raise SettingError(
            f"--unix-mode {text}: expected an octal mode up to 777 that lets this user read and write "
            "(600: this user only, 660: its group too)"
        )
    return mode


def _clear_unix(path: str) -> None:
    """Make room for the socket at `path`: nothing there, or a socket nobody listens on
    (what a killed server leaves), which is removed. Anything else stops the start:
    unlinking a file destroys it, and unlinking a live server's socket steals its
    clients without a word to either server."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SettingError(f"--unix {path}: {error.strerror or error}") from None
    if not stat.S_ISSOCK(found.st_mode):
        raise SettingError(f"--unix {path}: something that is not a socket is there; not removing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # stale: bound once, nobody listening now
        return
    except OSError as error:
        raise SettingError(
            f"--unix {path}: cannot tell whether a server listens on it ({error.strerror or error})"
        ) from None
    finally:
        probe.close()
    raise SettingError(f"--unix {path}: a process listens on it (another fusee server?); not taking it over")


def _bind_unix(path: str, mode: int) -> socket.socket:
    """A socket bound at `path` with `mode`, not listening yet. bind() creates the file
    with the umask's mode; the chmod comes before listen(), and until listen() every
    connect is refused, so no one gets in under the umask's mode meanwhile."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, mode)
    except OSError:
        sock.close()
        raise
    return sock


def _remove_unix(path: str, inode: int) -> None:
    """Remove the socket at a clean stop, unless something else is at `path` by now."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


def _bind_tcp(address: tuple[str, int], option: str) -> list[socket.socket]:
    """Sockets bound to `address` (each address its host resolves to, as asyncio binds
    them), not listening yet: bound among the checks, so a port in use stops the start,
    naming `option`, before the directory opens or any "listening on" is printed."""
    host, port = address
    bound: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, where in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(where)
            sock.setblocking(False)
    except OSError as error:
        for sock in bound:
            sock.close()
        reason = os.strerror(error.errno) if isinstance(error.errno, int) and error.errno > 0 else str(error)
        raise SettingError(f"{option}: {reason}") from None
    return bound


async def serve(args: argparse.Namespace) -> int:
    if (args.dir is None) == (args.store is None):
        raise SettingError(
            "give --dir DIR (a data directory) or --store postgresql://... (a database), not both"
        )
    if args.listen is None and args.unix is None:
        raise SettingError("give --listen HOST:PORT, --unix PATH, or both")
    if args.shards is not None and args.shards < 1:
        raise SettingError(f"--shards {args.shards}: need at least 1")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SettingError("--tls-cert and --tls-key go together")
    if args.tls_ca is not None and args.tls_cert is None:
        raise SettingError("--tls-ca needs --tls-cert and --tls-key (mutual TLS is TLS)")
    if args.store is not None:
        check_url(args.store)
        if args.backup is not None:
            raise SettingError("--backup backs up a data directory; a --store database has its own backups")
    listen = _host_port(args.listen, "--listen") if args.listen is not None else None
    http = _host_port(args.http, "--http") if args.http is not None else None
    start = Start(args, listen, http)
    start.unix_mode = _unix_mode(args.unix_mode)
    start.invoked = endpoints.from_args(args)
    start.public_url = _public_url(args.public_url, http, args.tls_cert is not None)
    start.codec_url = _codec_url(args.codec_url)
    if start.codec_url is not None and http is None:
        raise SettingError("--codec-url is for the web UI: it needs --http")
    start.security = Security(args)
    _warn_exposed(listen, http, start.security.tokens.worker is not None, start.security.tls is not None)
    if args.unix is not None:
        _clear_unix(args.unix)
    start.http_sockets = _bind_tcp(http, f"--http {args.http}") if http is not None else []
    if args.store is not None:
        # Bound now, listening only once this server owns the shards: a standby's port
        # refuses connections, and workers and clients go on to the next address.
        start.listen_sockets = _bind_tcp(listen, f"--listen {args.listen}") if listen is not None else []
        return await _serve_store(start)
    if args.backup is not None:
        _check_backup(args.backup)
    server = await Server.open(str(args.dir), args.shards, args.backup)
    return await _run(server, start, f"in {args.dir}")


class Start:
    """The settings a start checked, for the run (and, on a store, each run after a
    standby's wait)."""

    def __init__(
        self, args: argparse.Namespace, listen: tuple[str, int] | None, http: tuple[str, int] | None
    ):
        self.args = args
        self.listen = listen
        self.http = http
        self.invoked: list[endpoints.Endpoint] = []
        self.public_url: str | None = None
        self.codec_url: str | None = None
        self.security: Security
        self.http_sockets: list[socket.socket] = []
        self.listen_sockets: list[socket.socket] = []
        self.unix_mode = 0o600


async def _serve_store(start: Start) -> int:
    """On a PostgreSQL store: stand by until this server owns the shards, then serve
    them until stopped; a server that loses them exits with status 3 (a supervisor
    starts it again, as a standby)."""
    args = start.args
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    connections = await database.pool(args.store)
    try:
        shards = await database.prepare(connections, args.store, args.shards)
        where = args.listen or f"unix:{args.unix}"
        ownership = Ownership(connections, shards, where)
        if not await wait_to_own(ownership, stopping):
            return 0
        store = PgStore(connections, args.store, shards, ownership)
        await store.take()
        server = Server.on_store(store)
        stopping_task = loop.create_task(stopping.wait())
        stopping_task.add_done_callback(lambda _: server.stopped.set())
        await _run(server, start, "in PostgreSQL (this server owns them)")
        stopping_task.cancel()
        if store.deposed:
            print(f"fusee server: stepped down: {store.stopped}", file=sys.stderr, flush=True)
            return 3
        if store.stopped is not None:
            raise IoError(f"--store: {store.stopped}")
        return 0
    finally:
        await connections.close()


async def _run(server: Server, start: Start, where: str) -> int:
    """Listen, serve until a signal (or the store) stops the server, and stop cleanly."""
    args, listen, http, security = start.args, start.listen, start.http, start.security
    tls = security.tls
    server.callback_url = start.public_url
    loop = asyncio.get_running_loop()
    unix_inode = None

    # Each new connection takes the settings current then (a SIGHUP replaces them).
    def plain() -> ServerConnection:
        return ServerConnection(server, security.tokens, b"")

    def secured() -> ServerConnection:
        return ServerConnection(server, security.tokens, security.binding)

    factory = secured if tls is not None else plain
    handshake_s = handshake.DEADLINE_S if tls is not None else None
    try:
        if listen is not None:
            if start.listen_sockets:
                for sock in start.listen_sockets:
                    server.listeners.append(
                        await loop.create_server(
                            factory, sock=sock, ssl=tls, ssl_handshake_timeout=handshake_s
                        )
                    )
            else:
                server.listeners.append(
                    await loop.create_server(
                        factory, listen[0], listen[1], ssl=tls, ssl_handshake_timeout=handshake_s
                    )
                )
            port = server.listeners[0].sockets[0].getsockname()[1]
            print(f"fusee server: listening on {listen[0]}:{port}", file=sys.stderr, flush=True)
        if args.unix is not None:
            unix = _bind_unix(args.unix, start.unix_mode)
            unix_inode = os.lstat(args.unix).st_ino  # removed at the stop if still ours
            server.listeners.append(await loop.create_unix_server(plain, sock=unix))
            print(f"fusee server: listening on unix:{args.unix}", file=sys.stderr, flush=True)
    except OSError as error:
        await server.stop()
        raise SettingError(f"--listen/--unix: {error.strerror or error}") from None
    api = None
    if http is not None:
        api = HttpApi(server, security.tokens, tls is not None, args.identity_header, start.codec_url)
        security.watchers.append(api.guard)
        try:
            port = await api.start(start.http_sockets, tls)
        except OSError as error:
            await api.close()
            await server.stop()
            # asyncio wraps the bind's error in a long message; its errno says it shortly.
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise SettingError(f"--http {args.http}: {reason}") from None
        host = f"[{http[0]}]" if ":" in http[0] else http[0]
        scheme = "https" if tls is not None else "http"
        print(f"fusee server: metrics on {scheme}://{host}:{port}/metrics", file=sys.stderr, flush=True)
        print(f"fusee server: web UI on {scheme}://{host}:{port}/ (API at /v1)", file=sys.stderr, flush=True)
        if server.callback_url is None:  # port 0 is known now
            server.callback_url = _public_url(None, (http[0], port), tls is not None)
    print(f"fusee server: {server.shards} shards {where}, ready", file=sys.stderr, flush=True)
    server.start()
    if start.invoked:
        server.invoker = Invoker(server, start.invoked)
        if api is not None:
            api.metrics.watch(server.invoker)
        server.invoker.start()
        for endpoint in start.invoked:
            print(f"fusee server: invoking {endpoint.url}", file=sys.stderr, flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stopped.set)
    loop.add_signal_handler(signal.SIGHUP, security.reload)
    await server.stopped.wait()
    logger.info("stopping: releasing every lease, closing the store")
    try:
        await server.stop()
    finally:
        if api is not None:
            await api.close()  # after the stop: /healthz answers 503 while it runs
        if unix_inode is not None:
            _remove_unix(args.unix, unix_inode)
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
