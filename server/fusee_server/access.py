"""Who may do what (docs/server.md, *Security*): the worker token (`--token-file`) holds
shards and reaches everything; a client token (`--client-token-file`) makes any call but
holds no shard; a read token (`--read-token-file`) makes only the calls that read, and
scrapes `/metrics`. The scope is fixed when a connection proves its token, and checked
on every frame after it: the listener and the HTTP site both ask here.

A client or read token needs the worker token: without one any peer may lease shards,
so a narrower token would guard nothing.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable

from fusee._secrets import Secret
from fusee.protocol import messages as m


class Scope(enum.Enum):
    WORKER = "worker"  # holds shards, any call: the worker token, or a server without tokens
    CLIENT = "client"  # any call, no shard
    READ = "read"  # calls that read, /metrics


# A call that reads: it records nothing, whatever its arguments. Everything else (start,
# signal, update, cancel, terminate, complete, fail, and any method added later) is a
# change, refused to a read token.
READ_METHODS = frozenset(
    {"list", "describe", "query", "result", "status", "invocations", "limits", "limit_usage"}
)
# What a peer without the worker token may send once open: calls, and its pings.
CLIENT_FRAMES = (m.Call, m.Ping)


class Tokens:
    """The server's tokens, each with its scope; none at all: every peer is a worker."""

    def __init__(
        self, worker: Secret | None, client: Secret | None = None, read: Secret | None = None
    ) -> None:
        if worker is None and (client is not None or read is not None):
            raise ValueError("a client or read token needs the worker token")
        self.worker = worker
        self.scoped = [
            (scope, token)
            for scope, token in ((Scope.WORKER, worker), (Scope.CLIENT, client), (Scope.READ, read))
            if token is not None
        ]

    def match(self, verifies: Callable[[Secret], bool]) -> tuple[Scope, Secret] | None:
        """The scope and token that `verifies` accepts (a proof, a bearer), if any. Every
        token is tried whichever matches, so the time taken does not say which did."""
        found = [(scope, token) for scope, token in self.scoped if verifies(token)]
        return found[0] if found else None

    def bearer(self, offered: bytes) -> Scope | None:
        """The scope of an HTTP bearer token; each comparison takes constant time."""
        matched = self.match(lambda token: hmac.compare_digest(offered, token))
        return matched[0] if matched is not None else None


def refusal(scope: Scope, message: object) -> str | None:
    """Why a peer of `scope` may not send `message` once open; None if it may."""
    if scope is Scope.WORKER:
        return None
    if not isinstance(message, CLIENT_FRAMES):
        return f"{type(message).__name__} is not a frame a {scope.value}-token peer sends (calls only)"
    if scope is Scope.READ and isinstance(message, m.Call) and message.method not in READ_METHODS:
        return f"call {message.method!r}: a read token makes only calls that read ({', '.join(sorted(READ_METHODS))})"
    return None
