"""The signature on an invocation request (docs/invoke.md, *One request*):
`fusee-signature: t=<unix ms>,v1=<hex>`, where `v1` is HMAC-SHA256 with the endpoint's
secret over `<t>.<body>` (the exact body bytes).

The handler checks it before it connects to anything, strictly: `t` is digits only and
within five minutes of now either way, each `v1` is exactly 64 lowercase hex digits,
several `v1=` may be given (a secret being rotated: any one that verifies will do), and
the MAC is compared in constant time. Anything else is refused with the reason, which the
handler logs and answers 401 without.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

HEADER = "fusee-signature"
TOLERANCE_MS = 300_000  # older or newer than this is refused (a replay window, clock skew)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGITS = re.compile(r"[0-9]{1,16}")


class SignatureError(ValueError):
    """A missing, malformed, stale or wrong signature; the message says which."""


def mac(secret: bytes, t: int, body: bytes) -> str:
    return hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, now_ms: int | None = None) -> str:
    """The header value for `body`, signed now."""
    t = int(time.time() * 1000) if now_ms is None else now_ms
    return f"t={t},v1={mac(secret, t, body)}"


def verify(header: str | None, body: bytes, secrets: list[bytes], now_ms: int | None = None) -> int:
    """The signature's time, if one of `secrets` signed `body` within the tolerance;
    SignatureError otherwise."""
    if header is None:
        raise SignatureError(f"no {HEADER} header")
    if not header.isascii():
        raise SignatureError(f"{HEADER}: not ASCII")
    t_text: str | None = None
    macs: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"{HEADER}: {part.strip()[:20]!r} is not key=value")
        if key == "t":
            if t_text is not None:
                raise SignatureError(f"{HEADER}: t given twice")
            if not _DIGITS.fullmatch(value):
                raise SignatureError(f"{HEADER}: t must be unix milliseconds, digits only")
            t_text = value
        elif key == "v1":
            if not _HEX64.fullmatch(value):
                raise SignatureError(f"{HEADER}: v1 must be 64 lowercase hex digits")
            macs.append(value)
        # Other keys (a later scheme's) are ignored, as a verifier of v1 should.
    if t_text is None or not macs:
        raise SignatureError(f"{HEADER}: needs t= and at least one v1=")
    t = int(t_text)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - t) > TOLERANCE_MS:
        raise SignatureError(f"{HEADER}: signed {now - t} ms from now, outside ±{TOLERANCE_MS} ms")
    expected = [mac(secret, t, body) for secret in secrets]
    # A list, not a generator: every pair is compared (each in constant time), so the
    # time taken does not tell which secret matched.
    if not any([hmac.compare_digest(e, got) for e in expected for got in macs]):
        raise SignatureError(f"{HEADER}: no v1 matches (wrong secret, or the body was changed)")
    return t
