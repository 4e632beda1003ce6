"""The connecting side's setup without I/O (`fusee/protocol/opening.py`), against a server
played here with the handshake's own functions: the frames it sends and in which order,
the frame limit it asks for at each state, and how it answers a refusal, a frame out of
order and a server without the token. Both drivers (the asyncio connection and the
pinger) are run against a real server in tests/server_mode."""

from __future__ import annotations

import pytest

from fusee.protocol import handshake as hs
from fusee.protocol import messages as m
from fusee.protocol.frames import HANDSHAKE_BYTES_MAX, PAYLOAD_BYTES_MAX, FrameError, Kind
from fusee.protocol.opening import ClientSetup, Refused, State

TOKEN = b"0123456789abcdef0123456789abcdef"
OPEN = m.Open(m.VERSION, m.ROLE_WORKER, 2)
WELCOME = m.payload(m.Welcome(shards=4, granted=[(1, 7)], ping_ms=1000, timeout_ms=5000, session=b"s"))


def test_with_a_token_it_proves_it_and_opens_then_takes_the_welcome_once_the_server_proved_it():
    setup = ClientSetup(TOKEN, OPEN)
    binding = hs.tls_binding(b"the server's certificate")
    [(kind, hello)] = setup.start(binding)
    assert (kind, setup.state, setup.frame_limit) == (Kind.HELLO, State.HELLO, HANDSHAKE_BYTES_MAX)
    hs.read_hello(hello)
    challenge = hs.challenge(hs.nonce())
    # OPEN goes behind the PROOF, in the same write (one round trip less)...
    [(kind, proof), opening] = setup.receive(Kind.CHALLENGE, challenge)
    assert opening == m.payload(OPEN)
    t = hs.transcript(hello, challenge, binding)
    assert (kind, setup.state, setup.frame_limit) == (Kind.PROOF, State.PROOF, HANDSHAKE_BYTES_MAX)
    hs.verify(hs.proof(TOKEN, t), proof)  # bound to the TLS session it was given
    # ...but the limit is raised, and the WELCOME taken, only once the server proved the token.
    assert setup.receive(Kind.ACCEPT, hs.accept(TOKEN, t)) == []
    assert (setup.state, setup.frame_limit) == (State.OPEN, PAYLOAD_BYTES_MAX)
    assert setup.receive(*WELCOME) == [] and setup.state is State.READY
    assert setup.welcome == m.decode(*WELCOME)


def test_without_a_token_the_first_frame_is_open():
    setup = ClientSetup(None, OPEN)
    assert setup.start(b"ignored") == [m.payload(OPEN)]
    assert setup.receive(*WELCOME) == [] and setup.welcome is not None


def test_a_server_without_the_token_is_never_believed():
    """Its forged ACCEPT fails, and a WELCOME without an ACCEPT is out of order: nothing it
    sends is taken, and it never gets more than the handshake's frame limit."""
    setup = ClientSetup(TOKEN, OPEN)
    [(_, hello)] = setup.start()
    challenge = hs.challenge(hs.nonce())
    setup.receive(Kind.CHALLENGE, challenge)
    forged = hs.accept(b"another token of 32 bytes, wrong", hs.transcript(hello, challenge))
    with pytest.raises(hs.HandshakeError, match="different tokens"):
        setup.receive(Kind.ACCEPT, forged)
    assert (setup.state, setup.frame_limit) == (State.PROOF, HANDSHAKE_BYTES_MAX)
    skipped = ClientSetup(TOKEN, OPEN)
    skipped.start()
    skipped.receive(Kind.CHALLENGE, hs.challenge(hs.nonce()))
    with pytest.raises(FrameError, match=r"during the connection's setup \(proof\)"):
        skipped.receive(*WELCOME)
    assert skipped.welcome is None


def test_a_refusal_at_any_state_carries_the_servers_reason():
    for token in (TOKEN, None):
        setup = ClientSetup(token, OPEN)
        setup.start()
        with pytest.raises(Refused) as refused:
            setup.receive(Kind.REFUSED, b"no such session: the worker's connection is gone")
        assert refused.value.reason == "no such session: the worker's connection is gone"


@pytest.mark.parametrize(
    ("token", "kind", "says"),
    [
        (TOKEN, Kind.ACCEPT, "during the connection's setup (hello)"),
        (TOKEN, Kind.WELCOME, "during the connection's setup (hello)"),
        (None, Kind.CHALLENGE, "during the connection's setup (open)"),
        (None, Kind.PING, "during the connection's setup (open)"),
    ],
)
def test_a_frame_out_of_order_is_a_frame_error_naming_the_state(token, kind, says):
    setup = ClientSetup(token, OPEN)
    setup.start()
    with pytest.raises(FrameError, match=r"frame kind \d+ " + says.replace("(", r"\(").replace(")", r"\)")):
        setup.receive(kind, b"")
