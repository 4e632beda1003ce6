"""Every way into the handler answers alike, before connecting to anything when it
refuses: 401 for a request that is not signed with the secret, 400 for a signed body that
is not an invocation, 502 when the server cannot be reached."""

from __future__ import annotations

import time

from fusee.protocol.signature import sign
from tests.support.handlers import BODY, SECRET, Entry, Listener


def now_ms() -> int:
    return int(time.time() * 1000)


def signed(body: bytes, secret: str = SECRET, at: int | None = None) -> dict[str, str]:
    return {"content-type": "application/json", "fusee-signature": sign(secret.encode(), body, at)}


def test_no_signature_is_401_and_connects_to_nothing(entry: Entry, listener: Listener) -> None:
    mark = listener.mark()
    assert entry.post({"content-type": "application/json"}, BODY) == (401, {"error": "unauthorized"})
    assert listener.settled() == mark


def test_a_stale_signature_is_401_and_connects_to_nothing(entry: Entry, listener: Listener) -> None:
    mark = listener.mark()
    assert entry.post(signed(BODY, at=now_ms() - 300_001), BODY)[0] == 401
    # The future one a little further: time passes between signing and checking (the exact
    # boundaries are checked on a frozen clock in test_signature.py).
    assert entry.post(signed(BODY, at=now_ms() + 305_000), BODY)[0] == 401
    assert listener.settled() == mark


def test_another_secret_or_another_body_is_401_and_connects_to_nothing(
    entry: Entry, listener: Listener
) -> None:
    mark = listener.mark()
    assert entry.post(signed(BODY, secret="another-secret-0123456789abcdef"), BODY)[0] == 401
    changed = BODY.replace(b'"budgetMs":60000', b'"budgetMs":60001')
    assert entry.post(signed(BODY), changed)[0] == 401
    assert listener.settled() == mark


def test_a_signed_body_that_is_not_an_invocation_is_400(entry: Entry, listener: Listener) -> None:
    mark = listener.mark()
    for body in (
        b"not json",
        b'{"version":1}',
        b'{"version":1,"invocation":"x","shards":["2"],"budgetMs":1}',
    ):
        status, answer = entry.post(signed(body), body)
        assert status == 400, body
        assert "not an invocation request" in answer["error"]
    assert listener.settled() == mark


def test_an_unreachable_server_is_502(entry: Entry, listener: Listener) -> None:
    listener.stop()
    try:
        status, answer = entry.post(signed(BODY), BODY)
    finally:
        listener.start()
    assert status == 502
    assert f"cannot connect to the server at {listener.address}" in answer["error"]


def test_a_server_that_closes_the_connection_is_502_and_the_signature_was_accepted(
    entry: Entry, listener: Listener
) -> None:
    # The header's name as a REST API passes it on (as the client wrote it).
    mark = listener.mark()
    status, answer = entry.post({"Fusee-Signature": signed(BODY)["fusee-signature"]}, BODY)
    assert status == 502
    assert "closed the connection during setup" in answer["error"]
    assert listener.settled() == mark + 1
