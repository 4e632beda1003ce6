"""Bodies that come slowly, never, or cut short, sent over raw sockets to
`uvicorn handlers.asgi:app` (fusee/invoke/_body.py): a request whose body is not whole
within the deadline is answered 408 and its connection closed, however many bytes trickle
in; at most `FUSEE_INVOKE_BODY_WAITS_MAX` wait at once, the longest waiting answered 503
to make room; a body cut short by a disconnect is dropped without a connection to the
server, even when what arrived is a signed invocation on its own."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import pytest

from fusee.protocol.signature import sign
from tests.support.handlers import BODY, SECRET, Listener, Uvicorn
from tests.support.procs import environment

TIMEOUT_S = 1.0
WAITS_MAX = 3


@pytest.fixture(scope="module")
def app(listener: Listener) -> Iterator[Uvicorn]:
    proc = Uvicorn(
        environment(
            FUSEE_URL=listener.address,
            FUSEE_INVOKE_SECRET=SECRET,
            FUSEE_WORKFLOWS="tests.invoke.flows",
            FUSEE_INVOKE_TRACE="1",
            FUSEE_INVOKE_BODY_TIMEOUT_S=str(TIMEOUT_S),
            FUSEE_INVOKE_BODY_WAITS_MAX=str(WAITS_MAX),
        )
    )
    yield proc
    proc.stop()


def post(port: int, declared: int, sent: bytes, headers: dict[str, str] | None = None) -> socket.socket:
    """A POST's headers saying `declared` bytes of body, and `sent` of them."""
    lines = [
        "POST / HTTP/1.1",
        "host: 127.0.0.1",
        "content-type: application/json",
        f"content-length: {declared}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + sent)
    return sock


def until_closed(sock: socket.socket, within_s: float, trickle: bool = False) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and when it closed it; while
    waiting, one more byte of the body every 0.1 s when `trickle`."""
    deadline = time.monotonic() + within_s
    received = b""
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        if trickle:
            try:
                sock.sendall(b" ")
            except OSError:  # the server closed its side: what it sent is still to be read
                trickle = False
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received, time.monotonic()
        if not data:
            return received, time.monotonic()
        received += data
    raise AssertionError(f"still open after {within_s} s, having sent {received!r}")


def status_of(answer: bytes) -> int:
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert found, answer
    return int(found.group(1))


def test_a_trickled_body_is_answered_408_and_closed_at_the_deadline(app: Uvicorn) -> None:
    began = time.monotonic()
    sock = post(app.port, 100, b"{")
    try:
        answer, closed_at = until_closed(sock, within_s=TIMEOUT_S + 4, trickle=True)
    finally:
        sock.close()
    assert status_of(answer) == 408
    assert b"connection: close" in answer.lower()
    assert b"the body did not arrive whole within 1 s" in answer
    # At the deadline, not at the first byte nor after the trickle (which never ended).
    assert TIMEOUT_S * 0.9 <= closed_at - began <= TIMEOUT_S + 3
    app.wait_for(r"refused status=408 why='the body did not arrive whole within 1 s'")


def test_at_most_waits_max_wait_the_longest_waiting_making_room(app: Uvicorn) -> None:
    waiting: list[socket.socket] = []
    try:
        for _ in range(WAITS_MAX + 2):
            waiting.append(post(app.port, 100, b"{"))
            time.sleep(0.05)  # in this order at the handler
        # A whole request is answered as ever, even with every place taken (it takes one
        # for as long as its body takes, no time at all: one more waiting one goes).
        whole = post(app.port, len(BODY), BODY)
        whole_answer = whole.recv(65536)
        whole.close()
        answers = [until_closed(sock, within_s=TIMEOUT_S + 4) for sock in waiting]
    finally:
        for sock in waiting:
            sock.close()
    assert status_of(whole_answer) == 401
    statuses = [status_of(answer) for answer, _ in answers]
    assert statuses == [503, 503, 503, 408, 408], statuses
    crowded = [at for (_, at), status in zip(answers, statuses, strict=True) if status == 503]
    late = [at for (_, at), status in zip(answers, statuses, strict=True) if status == 408]
    assert max(crowded) < min(late)  # made room at once, not at the deadline
    assert b"more than 3 requests were waiting for their body" in answers[0][0]


def test_a_body_cut_short_is_dropped_and_connects_to_nothing(app: Uvicorn, listener: Listener) -> None:
    """What arrived is a whole invocation, signed: only the Content-Length says there was
    more. Taken as complete, it would be run (it connects to the server)."""
    mark = listener.mark()
    sock = post(app.port, len(BODY) + 40, BODY, {"fusee-signature": sign(SECRET.encode(), BODY)})
    time.sleep(0.2)  # the handler has what arrived, and waits for the rest
    sock.close()
    found = app.wait_for(r" (dropped|received) .*", timeout=10)
    assert found.group(1) == "dropped", found.group(0)
    app.wait_for(r" dropped why='the peer disconnected before the whole body arrived'")
    assert listener.settled() == mark
