"""The request's signature as the handler checks it (spec: Invoked workers, *The request*),
on a frozen clock: the published test vector, then every malformed, stale or wrong header
answered 401 before anything is connected to, and every good one let through (the handler
then connects: the counting listener sees it, closes it, and the answer is 502)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fusee.invoke import InvocationHandler, invocation_handler
from fusee.protocol import signature
from fusee.testing import faults
from tests.invoke import flows
from tests.support.handlers import BODY, SECRET, Listener, published_vector

NOW = 1_796_025_600_000  # the frozen clock, in unix ms
KEY = SECRET.encode()


def test_the_published_test_vector_is_reproduced() -> None:
    vector = published_vector()
    secret, t, body = vector["secret"].encode(), int(vector["t"]), vector["body"].encode()
    assert vector["signed"] == f"{t}.{vector['body']}"
    assert signature.sign(secret, body, now_ms=t) == vector["header"].removeprefix("fusee-signature: ")
    assert signature.verify(vector["header"].removeprefix("fusee-signature: "), body, [secret], now_ms=t) == t


@pytest.fixture(autouse=True)
def frozen_clock() -> Iterator[None]:
    with faults.frozen_clock(signature, NOW):
        yield


def mac(t: int = NOW, body: bytes = BODY, key: bytes = KEY) -> str:
    return signature.mac(key, t, body)


GOOD = mac()
OTHER = mac(key=b"another-secret-0123456789abcdef")

REFUSED: dict[str, list[tuple[str | bytes, str | bytes]]] = {
    "no header": [],
    "empty": [("fusee-signature", "")],
    "t only": [("fusee-signature", f"t={NOW}")],
    "v1 only": [("fusee-signature", f"v1={GOOD}")],
    "t not digits": [("fusee-signature", f"t={NOW}a,v1={GOOD}")],
    "t negative": [("fusee-signature", f"t=-{NOW},v1={GOOD}")],
    "t with a plus": [("fusee-signature", f"t=+{NOW},v1={GOOD}")],
    "t a float": [("fusee-signature", f"t={NOW}.0,v1={GOOD}")],
    "t empty": [("fusee-signature", f"t=,v1={GOOD}")],
    "t with inner space": [("fusee-signature", f"t= {NOW},v1={GOOD}")],
    "t of 17 digits": [("fusee-signature", f"t=0{NOW:016d},v1={GOOD}")],
    "t in arabic-indic digits": [
        ("fusee-signature", f"t={str(NOW).translate(str.maketrans('0123456789', '٠١٢٣٤٥٦٧٨٩'))},v1={GOOD}")
    ],
    "t twice": [("fusee-signature", f"t={NOW},t={NOW},v1={GOOD}")],
    "v1 of 63 hex": [("fusee-signature", f"t={NOW},v1={GOOD[:63]}")],
    "v1 of 65 hex": [("fusee-signature", f"t={NOW},v1={GOOD}0")],
    "v1 empty": [("fusee-signature", f"t={NOW},v1=")],
    "v1 not hex": [("fusee-signature", f"t={NOW},v1={GOOD[:63]}g")],
    "v1 uppercase": [("fusee-signature", f"t={NOW},v1={GOOD.upper()}")],
    "v1 non-ASCII": [("fusee-signature", f"t={NOW},v1={GOOD[:63]}é")],
    "non-ASCII bytes": [(b"fusee-signature", f"t={NOW},v1={GOOD}".encode() + b"\xff")],
    "a part without =": [("fusee-signature", f"t={NOW},v1={GOOD},garbage")],
    "older by 300001 ms": [("fusee-signature", f"t={NOW - 300_001},v1={mac(NOW - 300_001)}")],
    "newer by 300001 ms": [("fusee-signature", f"t={NOW + 300_001},v1={mac(NOW + 300_001)}")],
    "another secret": [("fusee-signature", f"t={NOW},v1={OTHER}")],
    "another t under the mac": [("fusee-signature", f"t={NOW + 1},v1={GOOD}")],
    "another body": [("fusee-signature", f"t={NOW},v1={mac(body=BODY + b' ')}")],
    "several v1, none right": [("fusee-signature", f"t={NOW},v1={OTHER},v1={mac(NOW - 1)},v1={'0' * 64}")],
    "the header twice": [
        ("fusee-signature", f"t={NOW},v1={GOOD}"),
        ("fusee-signature", f"t={NOW},v1={GOOD}"),
    ],
}

ACCEPTED: dict[str, list[tuple[str | bytes, str | bytes]]] = {
    "plain": [("fusee-signature", f"t={NOW},v1={GOOD}")],
    "older by 300000 ms": [("fusee-signature", f"t={NOW - 300_000},v1={mac(NOW - 300_000)}")],
    "newer by 300000 ms": [("fusee-signature", f"t={NOW + 300_000},v1={mac(NOW + 300_000)}")],
    "several v1, the first right": [("fusee-signature", f"t={NOW},v1={GOOD},v1={OTHER}")],
    "several v1, the last right": [("fusee-signature", f"t={NOW},v1={OTHER},v1={'0' * 64},v1={GOOD}")],
    "v1 before t": [("fusee-signature", f"v1={GOOD},t={NOW}")],
    "spaces after commas": [("fusee-signature", f"t={NOW}, v1={GOOD}")],
    "a later scheme's key besides": [("fusee-signature", f"t={NOW},v2=whatever,v1={GOOD}")],
    "bytes, name in capitals": [(b"FUSEE-SIGNATURE", f"t={NOW},v1={GOOD}".encode())],
}


@pytest.mark.parametrize("headers", REFUSED.values(), ids=REFUSED.keys())
async def test_refused_before_connecting(
    handler: InvocationHandler, listener: Listener, headers: list[tuple[str | bytes, str | bytes]]
) -> None:
    mark = listener.mark()
    status, answer_headers, body = await handler.invoke(
        [("content-type", "application/json"), *headers], BODY
    )
    assert (status, body) == (401, b'{"error":"unauthorized"}')
    assert ("content-type", "application/json") in answer_headers
    assert listener.settled() == mark


@pytest.mark.parametrize("headers", ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_accepted_then_connects(
    handler: InvocationHandler, listener: Listener, headers: list[tuple[str | bytes, str | bytes]]
) -> None:
    mark = listener.mark()
    status, _, _ = await handler.invoke(headers, BODY)
    assert status == 502  # the listener closes what it accepts
    assert listener.settled() == mark + 1


async def test_a_mapping_of_headers_is_read_without_regard_to_case(
    handler: InvocationHandler, listener: Listener
) -> None:
    mark = listener.mark()
    assert (await handler.invoke({"Fusee-Signature": f"t={NOW},v1={GOOD}"}, BODY))[0] == 502
    assert (await handler.invoke({"Content-Type": "application/json"}, BODY))[0] == 401
    assert listener.settled() == mark + 1


async def test_any_of_several_secrets_verifies_while_one_is_rotated(listener: Listener) -> None:
    old, new = b"the-old-secret-0123456789abcdef", b"the-new-secret-0123456789abcdef"
    rotating = invocation_handler(listener.address, workflows=[flows.greet], secret=[new, old.decode()])
    mark = listener.mark()
    for key in (old, new):
        status, _, _ = await rotating.invoke({"fusee-signature": f"t={NOW},v1={mac(key=key)}"}, BODY)
        assert status == 502
    status, _, _ = await rotating.invoke({"fusee-signature": f"t={NOW},v1={GOOD}"}, BODY)
    assert status == 401
    assert listener.settled() == mark + 2
