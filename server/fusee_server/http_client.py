"""The invoker's HTTP POST to an endpoint's URL: HTTP/1.1 over asyncio streams, on
connections kept alive between invocations, and nothing else.

A POST through aiohttp's client took 0.4 to 0.5 ms from the call to the request's first
byte at an idle peer (a raw write: about 0.1 ms), on every invocation's critical path: a
cold start waits for it (bench/invoke_cost.py, the dispatch part). What the invoker needs
is small: one request shape, the status, two headers (Retry-After, Location) and the start
of the body; no redirect followed (a signed request goes to the configured URL only), no
proxy, no cookies, no compression. So:

- a connection is taken from the idle ones (the newest first: the oldest are the likeliest
  to have been closed by the peer's keep-alive timeout) or made, and goes back only after
  a whole response that leaves it reusable (HTTP/1.1, no `Connection: close`, the body's
  end known); on any failure, timeout or cancellation it is closed, never reused with a
  request half sent or a response half read;
- an idle connection the peer closed meanwhile is seen as such before it is used (its EOF
  was read while it sat idle) and dropped; one closed in the instant before the request
  was written fails that invocation as a connection failure, as aiohttp's pool does;
- a response's body is read whole (Content-Length, chunked, or to the connection's end)
  up to BODY_BYTES_MAX, of which DETAIL_BYTES are kept.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from fusee_server.invoke_answer import Answer

BODY_BYTES_MAX = 1 << 20  # a larger answer is cut here, and its connection not reused
DETAIL_BYTES = 500
HEADER_BYTES_MAX = 64 << 10
IDLE_MAX = 32  # idle connections kept per endpoint (its concurrency is 16 by default)


class HttpError(OSError):
    """The peer broke the exchange: closed early, or answered what is not HTTP/1.x."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class HttpClient:
    """POSTs to one URL (http or https)."""

    def __init__(self, url: str, context: ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: not an http(s) URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default_port else f"{host}:{self.port}"
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.context = (context or ssl.create_default_context()) if self.tls else None
        self.idle: list[_Conn] = []

    async def post(self, headers: dict[str, str], body: bytes, timeout_s: float) -> Answer:
        async with asyncio.timeout(timeout_s):
            conn = await self._take()
            try:
                answer, reusable = await self._exchange(conn, headers, body)
            except BaseException:
                conn.close()  # a request half sent or a response half read: never reused
                raise
        if reusable and len(self.idle) < IDLE_MAX:
            self.idle.append(conn)
        else:
            conn.close()
        return answer

    def close(self) -> None:
        """Close the idle connections (one in use is closed by its request's end)."""
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()

    async def _take(self) -> _Conn:
        while self.idle:
            conn = self.idle.pop()
            if conn.usable():
                return conn
            conn.close()
        try:
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.context,
                server_hostname=self.host if self.tls else None,
                limit=HEADER_BYTES_MAX,
            )
        except OSError as error:  # (ssl.SSLError too: a certificate that does not verify)
            why = error.strerror or str(error) or type(error).__name__
            raise HttpError(f"Cannot connect to host {self.authority} [{why}]") from None
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, headers: dict[str, str], body: bytes) -> tuple[Answer, bool]:
        lines = [f"POST {self.target} HTTP/1.1", f"host: {self.authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"content-length: {len(body)}")
        conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        reader = conn.reader
        while True:
            version, status = _status_line(await _line(reader))
            fields = await _fields(reader)
            if not 100 <= status < 200:
                break  # (1xx: an interim answer, such as 100 Continue; the real one follows)
        data, ended = await _body(reader, fields)
        reusable = (
            ended
            and version == "HTTP/1.1"
            and "close" not in fields.get("connection", "").lower()
            and conn.usable()
        )
        answer = Answer(
            status,
            fields.get("retry-after"),
            data[:DETAIL_BYTES].decode(errors="replace"),
            fields.get("location"),
        )
        return answer, reusable


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        raise HttpError("the endpoint closed the connection before it answered") from None
    except asyncio.LimitOverrunError:
        raise HttpError(f"a response line over {HEADER_BYTES_MAX} bytes") from None
    return line.rstrip(b"\r\n")


def _status_line(line: bytes) -> tuple[str, int]:
    version, _, rest = line.decode("latin-1").partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit():
        raise HttpError(f"not an HTTP/1.x response: {line[:80]!r}")
    return version, int(code)


async def _fields(reader: asyncio.StreamReader) -> dict[str, str]:
    """The header fields, names lowercased (a repeated one: the last)."""
    fields: dict[str, str] = {}
    size = 0
    while line := await _line(reader):
        size += len(line)
        if size > HEADER_BYTES_MAX:
            raise HttpError(f"response headers over {HEADER_BYTES_MAX} bytes")
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise HttpError(f"a malformed header line: {line[:80]!r}")
        fields[name.strip().lower()] = value.strip()
    return fields


async def _body(reader: asyncio.StreamReader, fields: dict[str, str]) -> tuple[bytes, bool]:
    """The body (up to BODY_BYTES_MAX) and whether its end was read, the connection then
    being ready for the next response."""
    try:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return await _chunked(reader)
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HttpError(f"a malformed Content-Length: {length[:40]!r}")
            size = int(length)
            if size > BODY_BYTES_MAX:
                return await reader.readexactly(DETAIL_BYTES), False
            return await reader.readexactly(size), True
        # Neither: the body runs to the connection's end (never reused).
        chunks: list[bytes] = []
        size = 0
        while size < BODY_BYTES_MAX and (chunk := await reader.read(BODY_BYTES_MAX - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), False
    except asyncio.IncompleteReadError:
        raise HttpError("the endpoint closed the connection in the middle of its answer") from None


async def _chunked(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        head = (await _line(reader)).split(b";", 1)[0].strip()
        try:
            length = int(head, 16)
        except ValueError:
            raise HttpError(f"a malformed chunk size: {head[:40]!r}") from None
        if length == 0:
            while await _line(reader):  # trailer fields, up to the blank line
                pass
            return b"".join(chunks), True
        size += length
        if size > BODY_BYTES_MAX:
            return b"".join(chunks), False
        chunks.append(await reader.readexactly(length))
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError("a chunk not followed by CRLF")
