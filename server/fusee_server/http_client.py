"""The invoker's HTTP POST to an endpoint's URL: HTTP/1.1 over asyncio streams, on
connections kept alive between invocations, and nothing else.

A POST through aiohttp's client took 0.4 to 0.5 ms from the call to the request's first
byte at an idle peer (a raw write: about 0.1 ms), on every invocation's critical path: a
cold start waits for it (bench/invoke_cost.py, the dispatch part). What the invoker needs
is small: one request shape, the status, two headers (Retry-After, Location) and the start
of the body; no redirect followed (a signed request goes to the configured URL only), no
proxy, no cookies, no compression. The protocol (the request's bytes, the response's
parsing: status, headers, Content-Length, chunked and close-delimited bodies, 1xx; whether
the connection may carry another exchange) is h11's, a sans-I/O HTTP/1.1 library; this
file only moves bytes and keeps the pool:

- a connection is taken from the idle ones (the newest first: the oldest are the likeliest
  to have been closed by the peer's keep-alive timeout) or made, and goes back only after
  a whole exchange that h11 says leaves it reusable (both sides DONE: HTTP/1.1, no
  `Connection: close`, the body's end known); on any failure, timeout or cancellation it
  is closed, never reused with a request half sent or a response half read;
- an idle connection the peer closed meanwhile is seen as such before it is used (its EOF
  was read while it sat idle) and dropped; one closed in the instant before the request
  was written fails that invocation as a connection failure, as aiohttp's pool does;
- a response's body is read whole up to BODY_BYTES_MAX, of which DETAIL_BYTES are kept; a
  larger one is cut there and its connection closed.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

import h11

from fusee_server.invoke_answer import Answer

BODY_BYTES_MAX = 1 << 20  # a larger answer is cut here, and its connection not reused
DETAIL_BYTES = 500
HEADER_BYTES_MAX = 64 << 10
READ_BYTES = 64 << 10
IDLE_MAX = 32  # idle connections kept per endpoint (its concurrency is 16 by default)


class HttpError(OSError):
    """The peer broke the exchange: closed early, or answered what is not HTTP/1.x."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEADER_BYTES_MAX)

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
                limit=READ_BYTES,
            )
        except OSError as error:  # (ssl.SSLError too: a certificate that does not verify)
            why = error.strerror or str(error) or type(error).__name__
            raise HttpError(f"Cannot connect to host {self.authority} [{why}]") from None
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, headers: dict[str, str], body: bytes) -> tuple[Answer, bool]:
        http = conn.http
        fields = [("host", self.authority), *headers.items(), ("content-length", str(len(body)))]
        try:
            request = http.send(h11.Request(method="POST", target=self.target, headers=fields))
            conn.writer.write(request + http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage()))
        except h11.LocalProtocolError as error:  # a header value h11 refuses to send
            raise HttpError(f"the request could not be sent: {error}") from None
        reading = _Reading(conn)
        response = await reading.response()
        detail, ended = await reading.body()
        # h11 decides reuse: both sides DONE (an HTTP/1.0 answer or `Connection: close`
        # leaves the peer in MUST_CLOSE); and the peer must not have closed it meanwhile.
        reusable = ended and http.our_state is h11.DONE and http.their_state is h11.DONE and conn.usable()
        if reusable:
            http.start_next_cycle()
        answer = Answer(
            response.status_code,
            _field(response, b"retry-after"),
            detail.decode(errors="replace"),
            _field(response, b"location"),
        )
        return answer, reusable


class _Reading:
    """One response read through h11, its failures said as HttpError."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.first = b""  # the first bytes received: what a non-HTTP answer said
        self.eof = False
        self.answered = False  # the response's head was read (h11's state is ERROR once it failed)

    async def _event(self) -> h11.Event:
        http = self.conn.http
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as error:
                raise self._broken(str(error)) from None
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:  # (only after a whole response; never read past it)
                raise self._broken("more data after the response")
            data = await self.conn.reader.read(READ_BYTES)
            self.first = self.first or data[:80]
            self.eof = not data
            http.receive_data(data)  # (b"": the peer's EOF, which h11 judges)

    def _broken(self, why: str) -> HttpError:
        if not self.answered:
            if self.first and not self.first.startswith(b"HTTP/1."):
                return HttpError(f"not an HTTP/1.x response: {self.first!r}")
            if self.eof:
                return HttpError("the endpoint closed the connection before it answered")
        elif self.eof:
            return HttpError("the endpoint closed the connection in the middle of its answer")
        return HttpError(f"a malformed response: {why}")

    async def response(self) -> h11.Response:
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                self.answered = True
                return event
            if not isinstance(event, h11.InformationalResponse):  # (1xx: the real one follows)
                raise self._broken(f"{type(event).__name__} where a response was due")

    async def body(self) -> tuple[bytes, bool]:
        """The body's first DETAIL_BYTES, and whether its end was read within BODY_BYTES_MAX."""
        kept = bytearray()
        size = 0
        while True:
            event = await self._event()
            if isinstance(event, h11.EndOfMessage):
                return bytes(kept), True
            if not isinstance(event, h11.Data):
                raise self._broken(f"{type(event).__name__} within a body")
            size += len(event.data)
            if len(kept) < DETAIL_BYTES:
                kept += event.data[: DETAIL_BYTES - len(kept)]
            if size > BODY_BYTES_MAX:
                return bytes(kept), False  # cut: the rest is never read, the connection closed


def _field(response: h11.Response, name: bytes) -> str | None:
    """A response header's value (repeated: the last), h11 having lowercased the names."""
    value = None
    for field, data in response.headers:
        if field == name:
            value = data.decode("latin-1")
    return value
