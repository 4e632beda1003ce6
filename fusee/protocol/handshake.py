"""The token exchange that opens every connection (docs/FORMAT.md, *The token exchange*),
as pure functions over bytes: both sides prove they hold the shared token with
HMAC-SHA256, over fresh nonces, before either sends a protocol frame.

    worker -> HELLO      version 1, purpose (1 server), sender u8, nonce [32]
    server -> CHALLENGE  version 1, nonce [32]
    worker -> PROOF      HMAC(token, "fusee auth v1 initiator" + T)
    server -> ACCEPT     HMAC(token, "fusee auth v1 responder" + T), or REFUSED: a reason
    T = hello body + challenge body + binding length u8 + binding

`binding` ties the proofs to the TLS session so a proof cannot be relayed into another
one. The design binds to 32 bytes of TLS exporter output; Python's `ssl` has no exporter,
so here the binding is the SHA-256 of the server's certificate (DER), which both sides
know under TLS (a relay into a session with another certificate fails); without TLS it is
empty (docs/FORMAT.md says why). The token never crosses the wire; MACs are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import NamedTuple

from fusee._errors import RejectedError

VERSION = 1
PURPOSE_SERVER = 1  # 2 is reserved for a replica, refused until replicated servers exist
NONCE_BYTES = 32
DEADLINE_S = 10.0  # TLS and the exchange finish within this, or the connection closes
_HELLO = struct.Struct("<BBB32s")
_CHALLENGE = struct.Struct("<B32s")
_INITIATOR = b"fusee auth v1 initiator"
_RESPONDER = b"fusee auth v1 responder"


class Hello(NamedTuple):
    purpose: int
    sender: int
    nonce: bytes


class HandshakeError(RejectedError):
    """A malformed exchange or a proof that does not verify."""


def nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def hello(nonce: bytes, purpose: int = PURPOSE_SERVER, sender: int = 0) -> bytes:
    if len(nonce) != NONCE_BYTES or purpose != PURPOSE_SERVER or not 0 <= sender <= 255:
        raise HandshakeError("hello: a 32-byte nonce, purpose 1, a sender from 0 to 255")
    return _HELLO.pack(VERSION, purpose, sender, nonce)


def read_hello(body: bytes) -> Hello:
    if len(body) != _HELLO.size:
        raise HandshakeError(f"hello of {len(body)} bytes (expected {_HELLO.size})")
    version, purpose, sender, nonce_ = _HELLO.unpack(body)
    if version != VERSION:
        raise HandshakeError(f"hello version {version}: this side speaks version {VERSION}")
    if purpose != PURPOSE_SERVER:
        raise HandshakeError(f"hello purpose {purpose} (1: server; 2, a replica, is not built)")
    return Hello(purpose, sender, nonce_)


def challenge(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_BYTES:
        raise HandshakeError("challenge: a 32-byte nonce")
    return _CHALLENGE.pack(VERSION, nonce)


def read_challenge(body: bytes) -> bytes:
    """The server's nonce."""
    if len(body) != _CHALLENGE.size:
        raise HandshakeError(f"challenge of {len(body)} bytes (expected {_CHALLENGE.size})")
    version, nonce_ = _CHALLENGE.unpack(body)
    if version != VERSION:
        raise HandshakeError(f"challenge version {version}: this side speaks version {VERSION}")
    return bytes(nonce_)


def transcript(hello_body: bytes, challenge_body: bytes, binding: bytes = b"") -> bytes:
    if len(binding) > 255:
        raise HandshakeError("a binding is at most 255 bytes")
    return hello_body + challenge_body + bytes([len(binding)]) + binding


def tls_binding(server_certificate_der: bytes) -> bytes:
    """What binds the proofs to a TLS session here: the server certificate's SHA-256."""
    return hashlib.sha256(server_certificate_der).digest()


def proof(token: bytes, t: bytes) -> bytes:
    """The worker's (initiator's) proof."""
    return hmac.new(token, _INITIATOR + t, hashlib.sha256).digest()


def accept(token: bytes, t: bytes) -> bytes:
    """The server's (responder's) proof, sent only once the worker's verified."""
    return hmac.new(token, _RESPONDER + t, hashlib.sha256).digest()


def verifies(expected: bytes, got: bytes) -> bool:
    """Whether `got` is the proof `expected`, compared in constant time."""
    return hmac.compare_digest(expected, got)


def verify(expected: bytes, got: bytes) -> None:
    if not verifies(expected, got):
        raise HandshakeError("the peer's proof does not verify: the two sides hold different tokens")
