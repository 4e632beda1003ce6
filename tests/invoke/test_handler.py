"""The handler's settings, refused when wrong as it is made (not at its first request), and
its ASGI side beyond the invocation itself: lifespan, methods, bodies in pieces."""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from typing import Any

import pytest

import fusee
import fusee.invoke
from fusee.invoke import InvocationHandler, invocation_handler
from fusee.invoke._invocation import Budget
from fusee.protocol.address import parse
from fusee.protocol.signature import sign
from tests.invoke import events, flows
from tests.support.handlers import BODY, SECRET, Listener, in_thread


def test_the_public_names() -> None:
    assert fusee.invoke.__all__ == [
        "Invocation",
        "InvocationHandler",
        "ShardSummary",
        "Summary",
        "invocation_handler",
    ]


def test_a_bad_address_is_refused_naming_it() -> None:
    with pytest.raises(fusee.RejectedError, match="expected host:port"):
        invocation_handler("nowhere", workflows=[flows.greet], secret=SECRET)
    with pytest.raises(fusee.RejectedError, match="invocation= is set per request"):
        invocation_handler("127.0.0.1:7600?invocation=abc", workflows=[flows.greet], secret=SECRET)


def test_an_address_may_be_given_parsed() -> None:
    handler = invocation_handler(parse("127.0.0.1:7600?max-shards=2"), workflows=[flows.greet], secret=SECRET)
    assert handler.address.max_shards == 2


@pytest.mark.parametrize(
    ("secret", "error", "match"),
    [
        (b"short", fusee.RejectedError, "at least 16"),
        ("", fusee.RejectedError, "at least 16"),
        ([], fusee.RejectedError, "give the secret"),
        ([SECRET, 42], TypeError, "expected bytes or str"),
    ],
)
def test_a_bad_secret_is_refused(secret: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        invocation_handler("127.0.0.1:7600", workflows=[flows.greet], secret=secret)


def test_engine_options_an_invocation_decides_itself_are_refused() -> None:
    with pytest.raises(TypeError, match="does not take park_after, shards"):
        invocation_handler(
            "127.0.0.1:7600", workflows=[flows.greet], secret=SECRET, shards=4, park_after="1s"
        )
    handler = invocation_handler(
        "127.0.0.1:7600", workflows=[flows.greet], secret=SECRET, retention="1d", record_stacks=False
    )
    assert handler.engine_options == {"retention": "1d", "record_stacks": False}


def test_workflows_are_checked() -> None:
    with pytest.raises(TypeError, match="a list of workflows"):
        invocation_handler("127.0.0.1:7600", workflows=flows.greet, secret=SECRET)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"made with @fusee\.workflow"):
        invocation_handler("127.0.0.1:7600", workflows=[flows.greet, print], secret=SECRET)  # type: ignore[list-item]

    async def other(ctx: fusee.Ctx) -> None:
        pass

    with pytest.raises(fusee.RejectedError, match="'greet' is given twice"):
        invocation_handler(
            "127.0.0.1:7600", workflows=[flows.greet, fusee.workflow("greet")(other)], secret=SECRET
        )
    same = invocation_handler("127.0.0.1:7600", workflows=[flows.greet, flows.greet], secret=SECRET)
    assert same.workflows == [flows.greet]


async def test_without_a_secret_it_warns_and_checks_nothing(
    listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "fusee.invoke"):
        open_door = invocation_handler(listener.address, workflows=[flows.greet], secret=None)
    assert "without a secret" in caplog.text
    mark = listener.mark()
    assert (await open_door.invoke({}, BODY))[0] == 502
    assert listener.settled() == mark + 1


async def test_the_trace_prints_one_line_per_event(
    listener: Listener, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "1")
    traced = invocation_handler(listener.address, workflows=[flows.greet], secret=SECRET)
    await traced.invoke({}, BODY)
    await traced.invoke({"fusee-signature": sign(SECRET.encode(), BODY)}, BODY)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("fusee invoke - +") and " refused status=401 " in lines[0]
    assert " received shards=[2, 5] budget_ms=60000 reasons=['call']" in lines[1]
    assert lines[1].startswith("fusee invoke 8f3c0e5a1b2d4c6e +")
    assert " answered status=502 " in lines[2]
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "0")
    quiet = invocation_handler(listener.address, workflows=[flows.greet], secret=SECRET)
    await quiet.invoke({}, BODY)
    assert capsys.readouterr().err == ""


# -- ASGI ------------------------------------------------------------------------------------


async def asgi(
    app: InvocationHandler, scope: dict[str, Any], chunks: list[bytes]
) -> tuple[int, dict[str, str], bytes]:
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": "/", "headers": [], **scope}, receive, send)
    start, body = sent
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert int(headers["content-length"]) == len(body["body"])
    return start["status"], headers, body["body"]


async def test_a_body_in_pieces_is_checked_whole(handler: InvocationHandler, listener: Listener) -> None:
    header = [(b"fusee-signature", sign(SECRET.encode(), BODY).encode())]
    mark = listener.mark()
    status, headers, _ = await asgi(handler, {"headers": header}, [BODY[:10], b"", BODY[10:]])
    assert status == 502
    assert headers["content-type"] == "application/json"
    assert listener.settled() == mark + 1


async def test_only_post_and_only_small_bodies(handler: InvocationHandler) -> None:
    status, headers, body = await asgi(handler, {"method": "GET"}, [b""])
    assert (status, headers["allow"], headers["connection"]) == (405, "POST", "close")
    assert json.loads(body) == {"error": "invocations are POSTed"}
    status, headers, _ = await asgi(handler, {}, [b"x" * (40 << 10), b"x" * (40 << 10)])
    assert (status, headers["connection"]) == (413, "close")
    # Declared too large: refused before a byte of it is read.
    declared = {"headers": [(b"content-length", b"%d" % ((64 << 10) + 1))]}
    status, headers, _ = await asgi(handler, declared, [])
    assert (status, headers["connection"]) == (413, "close")


@pytest.mark.parametrize(
    ("option", "value"),
    [("body_timeout_s", 0), ("body_timeout_s", "1"), ("body_waits_max", 0), ("body_waits_max", 1.5)],
)
def test_bad_body_limits_are_refused(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        invocation_handler("127.0.0.1:7600", workflows=[flows.greet], secret=SECRET, **{option: value})


async def test_lifespan_starts_and_stops_with_nothing_to_do(handler: InvocationHandler) -> None:
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await handler({"type": "lifespan"}, receive, send)
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    with pytest.raises(ValueError, match="serves HTTP, not 'websocket'"):
        await handler({"type": "websocket"}, receive, send)


def test_a_lambda_answer_is_json_text(handler: InvocationHandler) -> None:
    answer = in_thread(lambda: handler.lambda_handler(events.function_url({}, BODY), None))
    assert answer["statusCode"] == 401
    assert answer["headers"]["content-type"] == "application/json"
    assert answer["isBase64Encoded"] is False
    assert json.loads(answer["body"]) == {"error": "unauthorized"}


def test_under_lambda_the_context_is_read(handler: InvocationHandler, listener: Listener) -> None:
    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 3000

    event = events.function_url({"fusee-signature": sign(SECRET.encode(), BODY)}, BODY)
    mark = listener.mark()
    answer = in_thread(lambda: handler.lambda_handler(event, Context()))
    assert answer["statusCode"] == 502  # the listener closes the connection
    assert listener.settled() == mark + 1


@pytest.mark.parametrize(
    ("budget_ms", "limits", "stop_s", "end_s"),
    [
        (60_000, [], 55.0, 60.0),  # a tenth would be 6 s: at most 5
        (10_000, [], 9.0, 10.0),  # a tenth
        (60_000, [30.0], 25.0, 30.0),  # the lease's budget left, or the platform's time, is less
        (1_000, [5.0], 0.9, 1.0),
    ],
)
async def test_the_budget_stops_the_work_a_margin_before_it_ends(
    budget_ms: int, limits: list[float], stop_s: float, end_s: float
) -> None:
    budget = Budget(budget_ms, 100.0, *(100.0 + limit for limit in limits))
    assert budget.stop_at - 100.0 == pytest.approx(stop_s)
    assert budget.end_at - 100.0 == pytest.approx(end_s)
    assert budget.margin_s == pytest.approx(min(budget_ms / 10_000, 5.0))


async def test_refusals_are_logged_with_their_reason_at_most_every_ten_seconds(
    listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = invocation_handler(listener.address, workflows=[flows.greet], secret=SECRET)
    with caplog.at_level(logging.WARNING, "fusee.invoke"):
        for _ in range(3):
            assert (await fresh.invoke({}, BODY))[0] == 401
        assert [r.getMessage() for r in caplog.records] == ["refused a request: no fusee-signature header"]
        fresh._refusals.last -= 10  # ten seconds later
        assert (await fresh.invoke({"fusee-signature": "t=1"}, BODY))[0] == 401
    assert caplog.records[-1].getMessage() == (
        "refused a request: fusee-signature: needs t= and at least one v1= (2 more refused since the last line)"
    )
