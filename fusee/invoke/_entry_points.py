"""The invocation handler: one object, three ways in.

- `await handler.invoke(headers, body)` -> `(status, headers, body)`, for any framework;
- the handler itself is an ASGI app (uvicorn, Cloud Run, anything ASGI);
- `handler.lambda_handler(event, context)`: AWS Lambda, either invoked directly by the
  server (`--invoke lambda:FUNCTION`: the event is `{"fusee": {"headers", "body"}}`) or
  through mangum (function URLs, API Gateway v1 and v2, ALB), lifespan off.

Every request goes the same way: the signature is checked over the exact body bytes
before anything is connected to (401: nobody without the secret can make this process
open a connection), then the body is decoded (400), then the invocation runs (502 when
the server cannot be reached or refuses it, 200 with the summary otherwise).

| status | when | body |
| --- | --- | --- |
| 200 | the invocation ran (some shards may have lost their lease: see each) | the summary |
| 400 | a signed body that is not an invocation request | `{"error": ...}` |
| 401 | no signature, a malformed or stale one, or one no secret verifies | `{"error": "unauthorized"}` |
| 405 | not a POST (ASGI) | `{"error": ...}` |
| 408 | the body did not arrive whole within `body_timeout_s` (ASGI) | `{"error": ...}` |
| 413 | a body over 64 KiB (ASGI) | `{"error": ...}` |
| 500 | a failure of this process (logged with its traceback) | `{"error": ...}` |
| 502 | the server cannot be reached, refuses the connection, or goes during the open | `{"error": ...}` |
| 503 | more than `body_waits_max` requests waited for their body: the oldest (ASGI) | `{"error": ...}` |

Over ASGI, an answer given before the body was read whole closes the connection; a body
cut short by a disconnect gets no answer (fusee/invoke/_body.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from fusee import _secrets as secrets_
from fusee._errors import RejectedError
from fusee._log import RateLimit, rate_limited, trace_enabled
from fusee.engine.objects import Objects
from fusee.invoke import _request as request_
from fusee.invoke._body import BODY_TIMEOUT_S, BODY_WAITS_MAX, Bodies, Refused
from fusee.invoke._invocation import Trace, Unavailable, run
from fusee.protocol import signature
from fusee.protocol.address import Address
from fusee.protocol.address import parse as parse_address
from fusee.workflow.definitions import Workflow
from fusee.workflow.objects import ObjectType

logger = logging.getLogger("fusee.invoke")

Headers = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]
Response = tuple[int, list[tuple[str, str]], bytes]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# What Engine.open takes besides what an invocation decides itself (the storage, the
# shards, park_after): the rest would contradict it.
REFUSALS_EVERY_S = 10.0
ENGINE_OPTIONS = ("retention", "profile", "record_stacks", "retry", "clock", "telemetry", "codec")
_JSON = [("content-type", "application/json")]
_CLOSE = ("connection", "close")
# The key of a direct Lambda invocation's event (fusee_server/lambda_client.py sends it).
DIRECT = "fusee"
DIRECT_SHAPE = 'a direct invocation is {"fusee": {"headers": {name: value}, "body": "<JSON text>"}}'

_cold = True  # no invocation has run in this process yet


def _take_cold() -> bool:
    global _cold
    cold, _cold = _cold, False
    if cold:
        # What the process holds before its first invocation (the modules, the web
        # framework, the workflows) lives as long as it does: out of the collector's way,
        # a collection of the older generations no longer walks all of it again (about a
        # tenth of a woken run's CPU here). Once: a later freeze would keep garbage
        # cycles of the invocations before it for ever.
        gc.freeze()
    return cold


class InvocationHandler:
    """Runs the invocations a `fusee server` POSTs (docs/invoke.md). Keeps only its
    settings: each invocation connects, opens a fresh engine and closes both."""

    def __init__(
        self,
        address: str | Address,
        *,
        workflows: Sequence[Workflow[Any]],
        secret: bytes | str | Sequence[bytes | str] | None,
        trace: bool | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        body_waits_max: int = BODY_WAITS_MAX,
        **engine_options: Any,
    ) -> None:
        self.address = _address(address)
        self.bodies = Bodies(body_timeout_s, body_waits_max)
        self.workflows = _workflows(workflows)
        self.secrets = _secrets(secret)
        if not self.secrets:
            logger.warning(
                "invocation handler without a secret: it runs any request it is sent, so only the "
                "server may reach it (check the server's client certificate in front of it)"
            )
        unknown = sorted(set(engine_options) - set(ENGINE_OPTIONS))
        if unknown:
            raise TypeError(
                f"invocation_handler() does not take {', '.join(unknown)}: each invocation opens its "
                f"engine on the shards it was granted (engine options it takes: {', '.join(ENGINE_OPTIONS)})"
            )
        self.engine_options = engine_options
        self.trace = trace_enabled() if trace is None else trace
        self._lambda: Any = None
        self._loops = threading.local()
        # Refused requests are logged with their reason, at most one line every ten
        # seconds (with how many were refused meanwhile): a flood of bad requests does not
        # flood the log.
        self._refusals = RateLimit(REFUSALS_EVERY_S, "refused")
        self._refused = rate_limited(logger, self._refusals)

    # -- any framework -------------------------------------------------------------------

    async def invoke(self, headers: Headers, body: bytes, *, remaining_ms: int | None = None) -> Response:
        """Answer one request: `headers` as a mapping or (name, value) pairs, `body` the
        exact bytes received. `remaining_ms`: what the platform still allows this call,
        when it says (the handler stops before the budget or this, whichever is first)."""
        received_at = asyncio.get_running_loop().time()  # the budget's origin, on the loop's clock
        began = time.perf_counter()  # the summary's elapsed time: uvloop's loop clock moves in ms
        trace = Trace(self.trace)
        if self.secrets:
            try:
                signature.verify(_signature_header(headers), body, self.secrets)
            except signature.SignatureError as error:
                self._refused.warning("refused a request: %s", str(error))
                trace("refused", status=401, why=repr(str(error)))
                return _answer(401, {"error": "unauthorized"})
        try:
            request = request_.decode(body)
        except request_.RequestError as error:
            trace("refused", status=400, why=repr(str(error)))
            return _answer(400, {"error": str(error)})
        trace.invocation = request.invocation
        cold = _take_cold()
        trace("received", shards=request.shards, budget_ms=request.budget_ms, reasons=request.reasons)
        try:
            summary = await run(
                request,
                self.address,
                self.workflows,
                self.engine_options,
                received_at=received_at,
                remaining_ms=remaining_ms,
                cold=cold,
                trace=trace,
            )
        except Unavailable as error:
            logger.warning("invocation %s: %s", request.invocation, error)
            trace("answered", status=502, why=repr(str(error)))
            return _answer(502, {"error": str(error)})
        except Exception as error:
            logger.exception("invocation %s failed", request.invocation)
            trace("answered", status=500, why=repr(str(error)))
            return _answer(500, {"error": f"{type(error).__name__}: {error}"})
        summary.elapsed_ms = round((time.perf_counter() - began) * 1000, 3)
        trace("answered", status=200, elapsed_ms=summary.elapsed_ms)
        return 200, list(_JSON), request_.encode(summary)

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            raise ValueError(f"the invocation handler serves HTTP, not {kind!r}")
        if scope["method"] != "POST":
            status, headers, body = _answer(405, {"error": "invocations are POSTed"})
            headers += [("allow", "POST"), _CLOSE]  # a body it may have is not read
        else:
            data: bytes | Refused = Refused.TOO_LARGE
            if _declared_bytes(scope) <= request_.BODY_BYTES_MAX:  # else not read at all
                data = await self.bodies.read(receive)
            if data is Refused.CUT:
                # Nobody to answer, and a prefix of a body is not a request: checked and run
                # as if whole, it could be one the server never sent (a valid JSON prefix).
                self._refused.warning(
                    "refused a request: %s", "the peer disconnected before the whole body arrived"
                )
                Trace(self.trace)("dropped", why="'the peer disconnected before the whole body arrived'")
                return
            if isinstance(data, Refused):
                status, headers, body = self._refuse_body(data)
            else:
                context = scope.get("aws.context")  # set by mangum under Lambda
                status, headers, body = await self.invoke(
                    scope["headers"], data, remaining_ms=_remaining_ms(context)
                )
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (k.encode(), v.encode()) for k, v in [*headers, ("content-length", str(len(body)))]
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _refuse_body(self, refused: Refused) -> Response:
        """The answer to a body not read whole; the connection is closed after it (the rest
        of the body would otherwise be read as the next request, or hold the connection)."""
        if refused is Refused.TOO_LARGE:
            error = f"the body is over {request_.BODY_BYTES_MAX} bytes: too large for an invocation"
        elif refused is Refused.LATE:
            error = f"the body did not arrive whole within {self.bodies.timeout_s:g} s"
        else:
            error = f"more than {self.bodies.waits_max} requests were waiting for their body"
        if refused is not Refused.TOO_LARGE:
            self._refused.warning("refused a request: %s", error)
        Trace(self.trace)("refused", status=refused.value, why=repr(error))
        status, headers, body = _answer(refused.value, {"error": error})
        headers.append(_CLOSE)
        return status, headers, body

    # -- AWS Lambda ------------------------------------------------------------------------

    def lambda_handler(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """An AWS Lambda handler. A direct invocation (`{"fusee": {"headers": {...},
        "body": "..."}}`, the server's `--invoke lambda:FUNCTION`) goes to `invoke` as it
        is; a function URL, API Gateway (v1, v2) or ALB event goes through mangum (lifespan
        off; needs `pip install 'fusee[lambda]'`). Either way the answer is
        `{"statusCode", "headers", "body"}`, the body JSON text."""
        loop: asyncio.AbstractEventLoop | None = getattr(self._loops, "loop", None)
        if loop is None or loop.is_closed():
            # Mangum runs each request on the thread's current loop: one of ours, set
            # before the adapter exists, so neither ever finds a closed or missing one.
            loop = self._loops.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        if isinstance(event, dict) and DIRECT in event:
            return loop.run_until_complete(self._direct(event[DIRECT], context))
        if self._lambda is None:
            try:
                from mangum import Mangum
            except ImportError:
                raise RuntimeError("lambda_handler needs mangum: pip install 'fusee[lambda]'") from None
            self._lambda = Mangum(self, lifespan="off")
        result: dict[str, Any] = self._lambda(event, context)
        return result

    async def _direct(self, request: Any, context: Any) -> dict[str, Any]:
        """A direct invocation: the same checks as over HTTP (`invoke`), the signature
        over the body's exact bytes first. A malformed event connects to nothing either."""
        headers = request.get("headers") if isinstance(request, dict) else None
        body = request.get("body") if isinstance(request, dict) else None
        data: bytes | None = None
        if isinstance(body, str) and body.isascii():  # what the server sends: JSON, ASCII
            data = body.encode()
        if (
            data is None
            or not isinstance(headers, dict)
            or not all(isinstance(v, str) for v in headers.values())
        ):
            status, answer_headers, answer = _answer(400, {"error": DIRECT_SHAPE})
        else:
            status, answer_headers, answer = await self.invoke(
                headers, data, remaining_ms=_remaining_ms(context)
            )
        return {"statusCode": status, "headers": dict(answer_headers), "body": answer.decode()}


def invocation_handler(
    address: str | Address,
    *,
    workflows: Sequence[Workflow[Any]],
    secret: bytes | str | Sequence[bytes | str] | None,
    trace: bool | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
    body_waits_max: int = BODY_WAITS_MAX,
    **engine_options: Any,
) -> InvocationHandler:
    """The handler for invocations from the `fusee server` at `address` (its options, such
    as `token-file=` or `ca=`, included, their files read now), running `workflows`,
    checking each request's signature with `secret` (several: any one verifies, while a
    secret is rotated).
    `trace`: one line per invocation event on standard error (default: FUSEE_INVOKE_TRACE).
    `body_timeout_s`, `body_waits_max` (ASGI): the whole body arrives within this many
    seconds of the headers (408 otherwise), and at most this many requests wait for theirs
    at once (the longest waiting is answered 503 to make room): see fusee/invoke/_body.py.
    `engine_options`: retention, profile, record_stacks, retry, clock, telemetry, codec, as
    for Engine.open."""
    return InvocationHandler(
        address,
        workflows=workflows,
        secret=secret,
        trace=trace,
        body_timeout_s=body_timeout_s,
        body_waits_max=body_waits_max,
        **engine_options,
    )


def _address(address: str | Address) -> Address:
    parsed = parse_address(address) if isinstance(address, str) else address
    if not isinstance(parsed, Address):
        raise RejectedError(f"address {address!r}: expected host:port or unix:/path")
    if parsed.invocation is not None:
        raise RejectedError(
            f"address {address!r}: invocation= is set per request, from the server's; leave it out"
        )
    check_files(parsed)
    return parsed


def check_files(address: Address) -> None:
    """Read the files `address` names (token, CA, certificate and key) now, as the handler
    is made: a missing or wrong one is a RejectedError naming its option at start (the
    import of handlers/ fails), instead of a 500 with a traceback at every invocation.
    Each invocation still reads them as it connects, so a rotated file is taken up."""
    named = {"token-file": address.token_file, "ca": address.ca, "cert": address.cert, "key": address.key}
    for option, path in named.items():
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise RejectedError(f"{option}={path}: {error.strerror or error}") from None
    if address.token_file is not None:
        secrets_.load(address.token_file, "token-file=")  # its length too, as a connection reads it
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if address.ca is not None:
        try:
            context.load_verify_locations(cafile=address.ca)
        except ssl.SSLError as error:
            raise RejectedError(
                f"ca={address.ca}: not a CA certificate file (PEM): {error.reason or error}"
            ) from None
    if address.cert is not None:
        try:
            context.load_cert_chain(address.cert, address.key)
        except ssl.SSLError as error:
            raise RejectedError(
                f"cert={address.cert}, key={address.key}: not a certificate and its key (PEM): "
                f"{error.reason or error}"
            ) from None


def _workflows(workflows: Sequence[Workflow[Any] | ObjectType]) -> list[Workflow[Any]]:
    """The workflows, object types as their built-in workflows (docs/objects.md)."""
    if isinstance(workflows, (Workflow, ObjectType)) or not isinstance(workflows, Sequence):
        raise TypeError("workflows= takes a list of workflows made with @fusee.workflow (and object types)")
    by_name: dict[str, Workflow[Any]] = {}
    for item in workflows:
        wf = Objects.workflow_of(item) if isinstance(item, ObjectType) else item
        if not isinstance(wf, Workflow):
            raise TypeError(f"workflows= takes workflows made with @fusee.workflow, not {wf!r}")
        known = by_name.setdefault(wf.name, wf)
        if known.fn is not wf.fn:
            raise RejectedError(f"workflow type '{wf.name}' is given twice, with different code")
    return list(by_name.values())


def _secrets(secret: bytes | str | Sequence[bytes | str] | None) -> list[bytes]:
    """Each secret as fusee/_secrets.py takes one given as a value (stripped, at least 16
    bytes, as the server takes its --invoke-secret-file; never printed)."""
    if secret is None:
        return []
    values = [secret] if isinstance(secret, (bytes, str)) else list(secret)
    if not values:
        raise RejectedError("secret=: give the secret (or several, while one is rotated), or None")
    return [secrets_.given(value, "secret=") for value in values]


def _signature_header(headers: Headers) -> str | None:
    """The signature header's value; None when absent. Given twice it is refused: which
    copy a proxy kept would decide what is checked."""
    pairs: Iterable[tuple[str | bytes, str | bytes]] = (
        headers.items() if isinstance(headers, Mapping) else headers
    )
    found: str | None = None
    for name, value in pairs:
        text = name.decode("latin-1") if isinstance(name, bytes) else name
        if text.lower() == signature.HEADER:
            if found is not None:
                raise signature.SignatureError(f"{signature.HEADER} given twice")
            # latin-1 keeps every byte as one character: verify refuses what is not ASCII.
            found = value.decode("latin-1") if isinstance(value, bytes) else value
    return found


def _remaining_ms(context: Any) -> int | None:
    """What Lambda still allows this call (its context says), None elsewhere."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return int(remaining()) if remaining else None


def _answer(status: int, payload: dict[str, Any]) -> Response:
    return status, list(_JSON), request_.encode(payload)


def _declared_bytes(scope: Scope) -> int:
    """The body's Content-Length (0 when absent or not a number: the server enforces it,
    and the body read is bounded anyway)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: every invocation opens and closes its own engine."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
