"""The scopes of the server's tokens (`fusee_server/access.py`), frame by frame: what a
client or read token may send once open. The real server is tried with each token in
tests/server_mode/test_tokens.py."""

from __future__ import annotations

import pytest
from fusee_server.access import READ_METHODS, Scope, Tokens, refusal

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
    assert [tokens.bearer(bytes(t)) for t in (worker, client, read)] == [
        Scope.WORKER,
        Scope.CLIENT,
        Scope.READ,
    ]
    assert tokens.bearer(b"\x01" * 31) is None
    with pytest.raises(ValueError, match="needs the worker token"):
        Tokens(None, client)
