"""The request body (spec: Invoked workers, *The request*): signed, but not an invocation
request, it is answered 400 before anything is connected to. Types are strict; keys this
handler does not know are skipped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fusee.invoke import Invocation, InvocationHandler
from fusee.invoke._request import RequestError, decode
from fusee.protocol.signature import sign
from tests.support.handlers import SECRET, Listener

GOOD: dict[str, Any] = {
    "version": 1,
    "invocation": "8f3c0e5a1b2d4c6e",
    "shards": [2, 5],
    "budgetMs": 60000,
    "reasons": ["call", "timer"],
}


def body_with(**changes: Any) -> bytes:
    fields = {**GOOD, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()


NOT_INVOCATIONS: dict[str, bytes] = {
    "empty": b"",
    "not JSON": b"hello",
    "an array": b"[1,2]",
    "null": b"null",
    "trailing bytes": body_with() + b" x",
    "version 2": body_with(version=2),
    "version as text": body_with(version="1"),
    "no version": body_with(version=...),
    "no invocation": body_with(invocation=...),
    "an empty invocation": body_with(invocation=""),
    "an invocation with a space": body_with(invocation="8f3c 0e5a"),
    "an invocation with a newline": body_with(invocation="8f3c0e5a\n"),
    "an invocation of 129 characters": body_with(invocation="a" * 129),
    "a numeric invocation": body_with(invocation=123),
    "no shards": body_with(shards=...),
    "shards as text": body_with(shards="2,5"),
    "a shard as text": body_with(shards=["2"]),
    "a negative shard": body_with(shards=[-1]),
    "a fractional shard": body_with(shards=[2.0]),
    "a boolean shard": body_with(shards=[True]),
    "a shard out of range": body_with(shards=[65536]),
    "no budget": body_with(budgetMs=...),
    "the budget as text": body_with(budgetMs="60000"),
    "a fractional budget": body_with(budgetMs=60000.5),
    "a zero budget": body_with(budgetMs=0),
    "a negative budget": body_with(budgetMs=-1),
    "a boolean budget": body_with(budgetMs=True),
    "the budget in snake case": body_with(budgetMs=..., budget_ms=60000),
    "reasons as text": body_with(reasons="call"),
    "a numeric reason": body_with(reasons=[1]),
    "over 64 KiB": body_with(padding="x" * (64 << 10)),
}


@pytest.mark.parametrize("body", NOT_INVOCATIONS.values(), ids=NOT_INVOCATIONS.keys())
async def test_a_signed_body_that_is_not_an_invocation_is_400(
    handler: InvocationHandler, listener: Listener, body: bytes
) -> None:
    mark = listener.mark()
    status, _, answer = await handler.invoke({"fusee-signature": sign(SECRET.encode(), body)}, body)
    assert status == 400, answer
    assert json.loads(answer)["error"]
    assert listener.settled() == mark


def test_what_the_400_says() -> None:
    with pytest.raises(RequestError, match=r"Expected `int`, got `str` - at `\$.budgetMs`"):
        decode(body_with(budgetMs="60000"))
    with pytest.raises(RequestError, match="version 2: this handler speaks version 1"):
        decode(body_with(version=2))
    with pytest.raises(RequestError, match="over 65536"):
        decode(b" " * (65 << 10))


def test_unknown_keys_are_skipped_and_reasons_may_be_left_out() -> None:
    request = decode(body_with(reasons=..., priority=3, extra={"a": 1}))
    assert request == Invocation(version=1, invocation="8f3c0e5a1b2d4c6e", shards=[2, 5], budget_ms=60000)


async def test_an_invocation_with_unknown_keys_goes_on_to_connect(
    handler: InvocationHandler, listener: Listener
) -> None:
    body = body_with(priority=3)
    mark = listener.mark()
    status, _, _ = await handler.invoke({"fusee-signature": sign(SECRET.encode(), body)}, body)
    assert status == 502  # the listener closes what it accepts
    assert listener.settled() == mark + 1
