"""Direct Lambda invocations (`{"fusee": {...}}` events) fuzzed: random events and
mutations of a well-signed one get the documented answer, a 400 (not an invocation) or a
401 (a bad signature), and nothing else: no exception out of the handler, and no attempt
to connect. The handler's server address refuses connections, so an attempt would show
as a 502; a well-signed event that survives a mutation intact gets exactly that. (Counting
connections at a listener instead would also count strangers: processes of earlier tests
still retrying a port that the listener reused.)"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusee
from fusee.invoke import InvocationHandler
from fusee.protocol.signature import HEADER, sign
from tests.invoke import flows
from tests.support.handlers import SECRET, in_thread
from tests.support.procs import free_port

BODY = json.dumps(
    {"version": 1, "invocation": "0123456789abcdef", "shards": [0], "budgetMs": 1000, "reasons": ["call"]},
    separators=(",", ":"),
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def handler() -> InvocationHandler:
    """A handler whose server refuses connections (nothing listens on its port)."""
    return fusee.invocation_handler(f"127.0.0.1:{free_port()}", workflows=[flows.greet], secret=SECRET)


def signed_event() -> dict[str, Any]:
    headers = {"content-type": "application/json", HEADER: sign(SECRET.encode(), BODY.encode())}
    return {"fusee": {"headers": headers, "body": BODY}}


def answer(handler: InvocationHandler, event: Any) -> dict[str, Any]:
    got: dict[str, Any] = in_thread(lambda: handler.lambda_handler(event, None))
    assert isinstance(got, dict) and set(got) >= {"statusCode", "body"}, got
    assert isinstance(json.loads(got["body"]), dict)
    return got


@FUZZ
@given(inner=json_values)
def test_a_random_direct_event_is_400(handler: InvocationHandler, inner: Any) -> None:
    assert answer(handler, {"fusee": inner})["statusCode"] in (400, 401)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A signed event with one part changed; True when it is still the signed original."""
    event = signed_event()
    original = copy.deepcopy(event)
    inner = event["fusee"]
    where = draw(st.sampled_from(["body", "signature", "header-name", "drop", "extra", "type"]))
    if where == "body":
        body = inner["body"]
        at = draw(st.integers(0, len(body) - 1))
        inner["body"] = body[:at] + draw(st.text(min_size=0, max_size=3)) + body[at + 1 :]
    elif where == "signature":
        value = inner["headers"][HEADER]
        at = draw(st.integers(0, len(value) - 1))
        inner["headers"][HEADER] = value[:at] + draw(st.text(min_size=0, max_size=3)) + value[at + 1 :]
    elif where == "header-name":
        # (Header names are case-insensitive: "Fusee-Signature" is the same header.)
        name = draw(st.sampled_from(["Fusee-Signature", "fusee_signature", "x"]))
        inner["headers"][name] = inner["headers"].pop(HEADER)
        if name.lower() == HEADER:
            return event, True
    elif where == "drop":
        del inner[draw(st.sampled_from(["headers", "body"]))]
    elif where == "extra":
        # Keys beside headers and body are ignored (the signature covers the body).
        key = draw(st.text(max_size=8))
        if key not in inner:
            inner[key] = draw(json_values)
            return event, True
    else:
        inner[draw(st.sampled_from(["headers", "body"]))] = draw(json_values)
    return event, event == original


@FUZZ
@given(case=mutated())
def test_a_mutated_signed_event_is_refused_without_connecting(
    handler: InvocationHandler, case: tuple[dict[str, Any], bool]
) -> None:
    event, intact = case
    status = answer(handler, event)["statusCode"]
    assert status == (502 if intact else 400) or (not intact and status == 401), (status, event)
