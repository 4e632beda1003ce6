"""The token exchange (`fusee/protocol/handshake.py`): two sides with the same token
verify each other; a different token, a replayed exchange, another TLS binding or a
tampered hello or challenge does not verify; malformed bodies are refused naming what
is wrong. Token files are read by the one secret loader (tests/test_secrets.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.protocol import handshake as hs

TOKEN = b"0123456789abcdef0123456789abcdef"


def exchange(worker_token: bytes, server_token: bytes, binding: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """Run both sides; returns (transcript, the worker's proof, the server's proof)."""
    hello = hs.hello(hs.nonce())
    assert hs.read_hello(hello).purpose == hs.PURPOSE_SERVER
    challenge = hs.challenge(hs.nonce())
    hs.read_challenge(challenge)
    t = hs.transcript(hello, challenge, binding)
    return t, hs.proof(worker_token, t), hs.accept(server_token, t)


def test_two_sides_with_the_same_token_verify_each_other():
    t, worker_proof, server_proof = exchange(TOKEN, TOKEN, hs.tls_binding(b"a certificate"))
    hs.verify(hs.proof(TOKEN, t), worker_proof)  # the server checks the worker...
    hs.verify(hs.accept(TOKEN, t), server_proof)  # ...then the worker checks the server
    assert worker_proof != server_proof  # the two directions never verify each other


def test_a_different_token_does_not_verify_and_says_so():
    t, worker_proof, _ = exchange(b"x" * 32, TOKEN)
    with pytest.raises(hs.HandshakeError, match="different tokens"):
        hs.verify(hs.proof(TOKEN, t), worker_proof)


def test_fresh_nonces_and_the_binding_make_every_transcript_different():
    t1, p1, _ = exchange(TOKEN, TOKEN)
    t2, p2, _ = exchange(TOKEN, TOKEN)
    assert t1 != t2 and p1 != p2  # a recorded exchange never verifies again
    hello, challenge = hs.hello(bytes(32)), hs.challenge(bytes(32))
    relayed = hs.proof(TOKEN, hs.transcript(hello, challenge, hs.tls_binding(b"cert A")))
    with pytest.raises(hs.HandshakeError):
        hs.verify(hs.proof(TOKEN, hs.transcript(hello, challenge, hs.tls_binding(b"cert B"))), relayed)


@pytest.mark.parametrize(
    ("body", "reader", "says"),
    [
        (b"\x01\x01\x00" + bytes(31), hs.read_hello, "hello of 34 bytes"),
        (b"\x02\x01\x00" + bytes(32), hs.read_hello, "hello version 2"),
        (b"\x01\x03\x00" + bytes(32), hs.read_hello, "hello purpose 3"),
        (b"\x01\x02\x00" + bytes(32), hs.read_hello, "purpose 2 .1: server; 2, a replica, is not built"),
        (b"\x01" + bytes(33), hs.read_challenge, "challenge of 34 bytes"),
        (b"\x09" + bytes(32), hs.read_challenge, "challenge version 9"),
    ],
)
def test_a_malformed_body_is_refused_naming_the_field(body, reader, says):
    with pytest.raises(hs.HandshakeError, match=says):
        reader(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_are_a_hello_or_a_handshake_error(body: bytes):
    for reader in (hs.read_hello, hs.read_challenge):
        try:
            reader(body)
        except hs.HandshakeError:
            pass
