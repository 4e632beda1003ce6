"""The scopes of the server's tokens (`fusee_server/access.py`), frame by frame: what a
client or read token may send once open. The real server is tried with each token in
tests/server_mode/test_tokens.py."""

from __future__ import annotations

import pytest
from fusee_server.access import READ_METHODS, Grant, Refused, Scope, Tokens, admitted, check_call, refusal

from fusee._secrets import Secret
from fusee.protocol import messages as m


def call(method: str) -> m.Call:
    return m.Call(1, method, 0, m.encode_value({}))


@pytest.mark.parametrize("method", sorted(READ_METHODS))
def test_a_read_token_makes_the_calls_that_read(method):
    assert refusal(Scope.READ, call(method)) is None
    assert refusal(Scope.CLIENT, call(method)) is None


@pytest.mark.parametrize(
    "method",
    [
        "start",
        "signal",
        "signal_with_start",
        "update",
        "update_with_start",
        "cancel",
        "terminate",
        "complete",
        "fail",
        "a-new-one",
    ],
)
def test_a_read_token_makes_no_call_that_changes_something(method):
    assert "read token" in (refusal(Scope.READ, call(method)) or "")
    assert refusal(Scope.CLIENT, call(method)) is None  # a client token makes any call


@pytest.mark.parametrize(
    "frame",
    [m.Relay(0, False, b""), m.Answer(1), m.Append(0, 1, 1, []), m.Drain([0])],
    ids=lambda frame: type(frame).__name__,
)
def test_only_a_worker_sends_a_workers_frames(frame):
    for scope in (Scope.CLIENT, Scope.READ):
        assert "not a frame" in (refusal(scope, frame) or "")
    assert refusal(Scope.WORKER, frame) is None
    assert refusal(Scope.CLIENT, m.Ping()) is None


def test_a_bearer_is_matched_to_its_scope():
    worker, client, read = (Secret(bytes([n]) * 32, f"token {n}") for n in (1, 2, 3))
    tokens = Tokens(worker, client, read)
    acme = Secret(b"\x04" * 32, "namespace acme")
    tokens = Tokens(worker, client, read, {"acme": acme})
    assert [tokens.bearer(bytes(t)) for t in (worker, client, read, acme)] == [
        Grant(Scope.WORKER),
        Grant(Scope.CLIENT),
        Grant(Scope.READ),
        Grant(Scope.NAMESPACE, "acme"),
    ]
    assert tokens.bearer(b"\x01" * 31) is None
    with pytest.raises(ValueError, match="needs the worker token"):
        Tokens(None, client)


ACME = Grant(Scope.NAMESPACE, "acme")


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("start", {"type": "t", "id": "acme/1"}),
        ("signal", {"id": "acme/1", "name": "go"}),
        ("result", {"id": "acme/x/y"}),
        ("reset", {"id": "acme/1", "before_step": "s"}),
    ],
)
def test_a_namespace_token_reaches_ids_under_its_prefix(method, args):
    assert check_call(ACME, method, args) is args
    for outside in ("globex/1", "acme", "acmex/1", "", None, 7):
        with pytest.raises(Refused, match="namespace 'acme'"):
            check_call(ACME, method, {**args, "id": outside})


def test_a_namespace_lists_its_runs_and_makes_no_server_call():
    assert check_call(ACME, "list", {"type": None})["prefix"] == "acme/"
    assert check_call(ACME, "list", {"prefix": "ac"})["prefix"] == "acme/"
    assert check_call(ACME, "list", {"prefix": "acme/7"})["prefix"] == "acme/7"
    with pytest.raises(Refused):
        check_call(ACME, "list", {"prefix": "globex/"})
    for method in ("invocations", "limits", "limit", "limit_usage", "something-new"):
        with pytest.raises(Refused, match="full token"):
            check_call(ACME, method, {})
    with pytest.raises(Refused, match="fusee"):
        check_call(ACME, "start", {"type": "fusee.schedule", "id": "acme/s"})
    for token in ("not-a-token", None):
        with pytest.raises(Refused):
            check_call(ACME, "complete", {"token": token})


def test_the_binary_protocol_s_listing_is_narrowed_in_its_frame():
    listing = m.Call(3, "list", -1, m.encode_value({"type": "t"}))
    narrowed = admitted(ACME, listing)
    assert (narrowed.rid, m.decode_value(narrowed.args)) == (3, {"type": "t", "prefix": "acme/"})
    with pytest.raises(Refused, match="not a map"):
        admitted(ACME, m.Call(3, "status", 0, m.encode_value([1])))
    assert Grant(Scope.NAMESPACE, "acme").by == "token:namespace:acme"
    assert Grant(Scope.CLIENT).by == "token:client"
