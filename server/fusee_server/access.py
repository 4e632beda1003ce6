"""Who may do what (docs/server.md, *Security*): the worker token (`--token-file`) holds
shards and reaches everything; a client token (`--client-token-file`) makes any call but
holds no shard; a read token (`--read-token-file`) makes only the calls that read, and
scrapes `/metrics`; a namespace's token (`--namespaces-file`) makes the calls of a
client, on runs whose workflow ID starts with `<namespace>/` only. The scope is fixed when
a connection proves its token, and checked on every frame after it: the listener and the
HTTP site both ask here (`admitted`, `check_call`), so the two cannot disagree.

A client or read token needs the worker token: without one any peer may lease shards,
so a narrower token would guard nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
from collections.abc import Callable
from typing import Any

from fusee._errors import RejectedError
from fusee._secrets import Secret
from fusee.engine.tokens import parse_token
from fusee.protocol import messages as m
from fusee.protocol.frames import FrameError


class Scope(enum.Enum):
    WORKER = "worker"  # holds shards, any call: the worker token, or a server without tokens
    CLIENT = "client"  # any call, no shard
    READ = "read"  # calls that read, /metrics
    NAMESPACE = "namespace"  # a client's calls, on the runs under one ID prefix


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a proven token may do: its scope, and a namespace token's namespace."""

    scope: Scope
    namespace: str | None = None

    @property
    def prefix(self) -> str:
        """The start of every workflow ID a namespace token reaches."""
        return f"{self.namespace}/"

    @property
    def by(self) -> str:
        """The requester the audited records keep for this token (docs/run-operations.md)."""
        if self.scope is Scope.WORKER:
            return "token"
        if self.scope is Scope.NAMESPACE:
            return f"token:namespace:{self.namespace}"
        return f"token:{self.scope.value}"


class Refused(Exception):
    """A call or frame this token may not send; the message says why."""


# A call that reads: it records nothing, whatever its arguments. Everything else (start,
# signal, update, cancel, terminate, complete, fail, and any method added later) is a
# change, refused to a read token.
READ_METHODS = frozenset(
    {"list", "describe", "query", "result", "status", "invocations", "limits", "limit_usage", "streamRead"}
)
# What a peer without the worker token may send once open: calls, and its pings.
CLIENT_FRAMES = (m.Call, m.Ping)
# The calls on one run, named by their `id` argument; `complete` and `fail` name it in
# their token. A namespace token makes these on its runs, and `list` narrowed to them:
# nothing else (limits, invocations, schedules' engine types), which are the server's.
RUN_METHODS = frozenset(
    {
        "start",
        "signal_with_start",
        "update_with_start",
        "signal",
        "query",
        "update",
        "result",
        "status",
        "describe",
        "streamRead",
        "cancel",
        "terminate",
        "reset",
        "retry",
        "resume",
    }
)
TOKEN_METHODS = frozenset({"complete", "fail"})
ENGINE_TYPES = "fusee."  # the engine's own workflow types (schedules, delayed starts)


class Tokens:
    """The server's tokens, each with its scope; none at all: every peer is a worker."""

    def __init__(
        self,
        worker: Secret | None,
        client: Secret | None = None,
        read: Secret | None = None,
        namespaces: dict[str, Secret] | None = None,
    ) -> None:
        if worker is None and (client is not None or read is not None or namespaces):
            raise ValueError("a client, read or namespace token needs the worker token")
        self.worker = worker
        self.scoped = [
            (Grant(scope), token)
            for scope, token in ((Scope.WORKER, worker), (Scope.CLIENT, client), (Scope.READ, read))
            if token is not None
        ]
        for namespace, token in (namespaces or {}).items():
            self.scoped.append((Grant(Scope.NAMESPACE, namespace), token))

    def match(self, verifies: Callable[[Secret], bool]) -> tuple[Grant, Secret] | None:
        """The grant and token that `verifies` accepts (a proof, a bearer), if any. Every
        token is tried whichever matches, so the time taken does not say which did."""
        found = [(grant, token) for grant, token in self.scoped if verifies(token)]
        return found[0] if found else None

    def bearer(self, offered: bytes) -> Grant | None:
        """The grant of an HTTP bearer token; each comparison takes constant time."""
        matched = self.match(lambda token: hmac.compare_digest(offered, token))
        return matched[0] if matched is not None else None


def admitted(grant: Grant, message: Any) -> Any:
    """`message` as a peer of `grant` may send it once open (a namespace's listing
    narrowed to its runs); raises Refused."""
    if grant.scope is Scope.WORKER:
        return message
    if not isinstance(message, CLIENT_FRAMES):
        raise Refused(
            f"{type(message).__name__} is not a frame a {grant.scope.value}-token peer sends (calls only)"
        )
    if not isinstance(message, m.Call) or grant.scope is Scope.CLIENT:
        return message
    if grant.scope is Scope.READ:
        check_call(grant, message.method, {})
        return message
    try:
        args = m.decode_value(message.args)
    except FrameError:
        raise Refused(f"call {message.method!r}: its arguments do not decode") from None
    if not isinstance(args, dict):
        raise Refused(f"call {message.method!r}: its arguments are not a map")
    narrowed = check_call(grant, message.method, args)
    if narrowed is args:
        return message
    return m.Call(message.rid, message.method, message.shard, m.encode_value(narrowed))


def check_call(grant: Grant | None, method: str, args: dict[str, Any]) -> dict[str, Any]:
    """The one check of a call against a token, for the binary protocol and the HTTP
    API alike: `args`, or a namespace's listing narrowed to its prefix; raises Refused.
    `grant` None: a server without tokens."""
    if grant is None or grant.scope in (Scope.WORKER, Scope.CLIENT):
        return args
    if grant.scope is Scope.READ:
        if method not in READ_METHODS:
            raise Refused(
                f"call {method!r}: a read token makes only calls that read ({', '.join(sorted(READ_METHODS))})"
            )
        return args
    prefix = grant.prefix
    if method == "list":
        asked = args.get("prefix")
        if asked is not None and (
            type(asked) is not str or not (asked.startswith(prefix) or prefix.startswith(asked))
        ):
            raise Refused(
                f"list prefix {asked!r}: the namespace {grant.namespace!r} lists only IDs under {prefix!r}"
            )
        if asked is None or not asked.startswith(prefix):
            return {**args, "prefix": prefix}
        return args
    if method in TOKEN_METHODS:
        try:
            id: object = parse_token(args.get("token"))[0]  # type: ignore[arg-type]
        except RejectedError:  # not a token: refused as outside the namespace
            id = None
    elif method in RUN_METHODS:
        id = args.get("id")
    else:
        raise Refused(
            f"call {method!r}: the namespace {grant.namespace!r}'s token reaches runs only "
            "(limits, invocations, schedules and metrics need a full token)"
        )
    if type(id) is not str or not id.startswith(prefix):
        raise Refused(
            f"call {method!r} on {id!r}: the namespace {grant.namespace!r}'s token reaches only "
            f"workflow IDs that start with {prefix!r}"
        )
    kind = args.get("type")
    if method in ("start", "signal_with_start", "update_with_start") and (
        type(kind) is not str or kind.startswith(ENGINE_TYPES)
    ):
        raise Refused(
            f"start of type {kind!r}: a namespace's token cannot start the engine's own fusee.* types"
        )
    return args


def refusal(scope: Scope, message: Any) -> str | None:
    """Why a peer of `scope` (no namespace) may not send `message`; None if it may."""
    try:
        admitted(Grant(scope), message)
    except Refused as refused:
        return str(refused)
    return None
