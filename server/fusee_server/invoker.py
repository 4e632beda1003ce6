"""The invoker: when a shard has work and no worker, POST a signed request to an
endpoint whose handler opens an engine for it (docs/server.md, *Invoking workers*; the
handler's side in docs/invoke.md), or hand the same request to the Lambda Invoke API for
a `lambda:` endpoint (lambda_client.py).

A shard is due when no worker holds it and a call or a message waits for it, its last
holder's reported next due time comes, its holder left without reporting, or the server
started (`Reason`). Due shards are spread over each endpoint's free concurrency, each
invocation under a fresh ID that is valid until its request is answered: a process that
wakes up after that can neither connect with it nor write under its epochs. Failures back
off per endpoint, and per shard when its holder crashed; a platform's throttle (429, 503)
backs off too and also lowers the endpoint's concurrency, which climbs back with
successes. A call for a shard whose endpoint backs off after failures probes it (one
invocation in flight at a time, one a second at most), so an endpoint that came up
meanwhile is used at once; and a call waiting on an endpoint that keeps failing is told
why, instead of waiting its 60 s out.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import secrets
import ssl
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import msgspec

from fusee._backoff import Backoff
from fusee._log import trace_enabled, trace_logger
from fusee.protocol import messages as m
from fusee.protocol.signature import HEADER, sign
from fusee_server import lambda_client
from fusee_server.endpoints import Endpoint
from fusee_server.http_client import HttpClient
from fusee_server.invoke_answer import Answer, describe
from fusee_server.lambda_client import LambdaTransport

if TYPE_CHECKING:
    from fusee_server.listener import ServerConnection

logger = logging.getLogger("fusee.invoker")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 30.0
THROTTLE_PAUSE_S = 1.0  # a throttle without Retry-After pauses the endpoint at least this
PROBE_EVERY_S = 1.0  # calls probe an endpoint in backoff at most this often
# A call waiting for a holder fails, saying why, once an invocation sent for its shard after
# it arrived failed and the endpoint has failed this many backoff rounds in a row (0.1 s,
# 0.2 s, 0.4 s of backoff: a one-off failure is retried, an endpoint that stays down is not
# waited on for a minute).
FAILED_ROUNDS_FOR_CALLS = 3
ERRORS_KEPT = 8  # per endpoint, the last failures' descriptions
NO_PROGRESS_FIRST_S = 1.0
NO_PROGRESS_MAX_S = 300.0
REPORT_WAIT_S = 1.0  # after a 2xx, how long the worker's connection may take to close
OVERDUE_S = 1.0
SUCCESSES_PER_STEP_UP = 4  # a throttled endpoint climbs back one slot per this many
LEAD_MIN_S = 0.005
LEAD_MAX_S = 0.2  # under the worker's 250 ms: it stays for a timer this close


_trace = trace_logger("fusee.invoker.trace")


class Reason(enum.StrEnum):
    """Why a shard is due, as the request's `reasons` names them (docs/server.md, *Due*),
    listed in the order a request lists them."""

    CALL = "call"  # a client's call for it waits at the server
    MESSAGE = "message"  # a message from another shard waits for it at the server
    TIMER = "timer"  # the next due time its last holder reported came
    PERMIT = "permit"  # a permit was granted to a step its last holder left waiting (our extension)
    RECOVERY = "recovery"  # nothing is known of it: the server started, or its holder left without reporting
    HANDBACK = "handback"  # its invoked holder left it with work left (its budget ended, or runs busy)
    CODE = "code"  # its holder had runs of a type it has no code for, and another endpoint lists it


class Due:
    """One shard's invoking state."""

    def __init__(self) -> None:
        self.at: float | None = None  # loop time it is due at (None: nothing due)
        self.reasons: set[Reason] = set()
        # Why it was last sent: due for the same again when that invocation ends with the
        # shard neither held nor reported (it failed, or its worker took nothing).
        self.sent_reasons: set[Reason] = set()
        self.types: set[str] = set()  # workflow types it has work of (start calls, no code)
        self.backoff_until = 0.0
        self.backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S)  # its invoked holders left without reporting
        # The invocation whose crash last stepped `backoff`: a crashed invocation is
        # seen twice (its connection closes, then its request fails) and is one failure.
        self.failed: str | None = None
        self.stalled = Backoff(NO_PROGRESS_FIRST_S, NO_PROGRESS_MAX_S)  # invocations without progress
        self.invocation: Invocation | None = None
        self.last_endpoint: EndpointState | None = None
        self.reported = False  # its last invoked holder sent IDLE for its lease
        self.trace: str | None = None  # a traceparent of a start waiting for it, if one had one
        self.steps = 0  # steps its invoked holders reported running (`/metrics`, per shard)


class Invocation:
    def __init__(self, endpoint: EndpointState, shards: list[int], reasons: list[Reason], now: float) -> None:
        self.id = secrets.token_hex(8)
        self.endpoint = endpoint
        self.shards = shards
        self.reasons = reasons
        self.sent = now
        self.error = ""  # how it failed, in words (invoke_answer.describe)
        self.conn: ServerConnection | None = None
        self.connected: float | None = None  # when its worker connected (loop time)
        self.leased = False
        self.steps = 0
        self.open_ms = 0.0
        self.closed = asyncio.Event()  # its worker's connection is gone
        self.trace: str | None = None  # the `traceparent` header its POST carries

    def budget_left_ms(self, now: float) -> int:
        return max(0, int(self.endpoint.config.budget_ms - (now - self.sent) * 1000))


class HttpTransport:
    """POSTs to one endpoint's URL, as `LambdaTransport` calls a function: what it answered,
    as an `Answer`, so the outcome is decided in one place for both kinds of endpoint.
    Through http_client.py, not aiohttp's client: a cold start waits for this POST."""

    def __init__(self, config: Endpoint) -> None:
        self.config = config
        self.client: HttpClient | None = None  # made at the first request

    def _client(self) -> HttpClient:
        if self.client is None:
            context: ssl.SSLContext | None = None
            config = self.config
            if config.ca is not None or config.cert is not None:
                context = ssl.create_default_context(cafile=config.ca)
                if config.cert is not None:
                    context.load_cert_chain(config.cert, config.key)
            self.client = HttpClient(config.url, context)
        return self.client

    async def send(self, headers: dict[str, str], body: bytes) -> Answer:
        """What the endpoint's URL answered a POST. No redirect is followed: the signed
        request would go to whatever origin the Location names (https to http included).
        A 3xx is a failed answer."""
        config = self.config
        return await self._client().post(headers, body, (config.budget_ms + config.grace_ms) / 1000)

    async def close(self) -> None:
        if self.client is not None:
            self.client.close()


class EndpointState:
    def __init__(self, config: Endpoint) -> None:
        self.config = config
        self.in_flight: set[Invocation] = set()
        self.concurrency = config.concurrency  # lowered by throttles, climbing back
        self.successes = 0
        self.backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S)  # failures and throttles in a row
        self.backoff_until = 0.0
        self.backoff_set_at = -1.0  # when the backoff last grew (loop time)
        self.throttled_until = 0.0  # the part of the backoff a throttle asked for: no probe then
        self.failures = 0  # invocations failed in a row (a success resets it; throttles are not failures)
        self.failed_rounds = 0  # backoff steps taken for failures in a row
        # (when, what) of the failures since the last success, newest last: what a call that
        # waited in vain is told. `last_error` outlives a success (the metrics show it).
        self.errors: deque[tuple[float, str]] = deque(maxlen=ERRORS_KEPT)
        self.last_error: str | None = None
        self.probe: Invocation | None = None  # sent for a call while backing off, not answered yet
        self.probed_at = -PROBE_EVERY_S
        self.counts: Counter[str] = Counter()
        self.open_ms = 0.0  # the engines' open time, summed
        self.opens = 0  # IDLE reports (each an engine's open of a shard)
        self.total_ms = 0.0  # sending to the answer, summed...
        self.max_ms = 0.0  # ...and at most
        self.answer_ms: list[float] = []  # the last 256 times from sending to the answer
        self.ready_s: list[float] = []  # the last 64 times from sending to an engine being open
        # A lambda: endpoint calls the Invoke API instead of POSTing (boto3 loads here, at
        # the start, so the first invocations do not wait for it).
        self.transport: LambdaTransport | HttpTransport = (
            LambdaTransport(config) if lambda_client.is_lambda(config.url) else HttpTransport(config)
        )

    def lead_s(self) -> float:
        """How much before a timer to invoke for it: the time this endpoint usually takes
        from the request to an open engine (p90), and a little more. The woken worker
        waits out the rest itself (a timer due within 250 ms keeps it from leaving)."""
        if not self.ready_s:
            return LEAD_MIN_S
        ready = sorted(self.ready_s)
        return min(LEAD_MAX_S, ready[int(len(ready) * 0.9)] + LEAD_MIN_S)

    def probe_at(self) -> float | None:
        """When a call may probe this endpoint next (None: a probe is in flight)."""
        return None if self.probe is not None else self.probed_at + PROBE_EVERY_S

    def failing(self, now: float) -> str:
        """Its last failures, newest first, the same ones counted once: what a call that
        waited for it is told."""
        seen: dict[str, tuple[int, float]] = {}
        for at, text in reversed(self.errors):
            count, last = seen.get(text, (0, at))
            seen[text] = (count + 1, last)
        parts = [
            f"{text} ({'once' if n == 1 else f'{n} times'}, {now - last:.1f} s ago)"
            for text, (n, last) in seen.items()
        ]
        return "; ".join(parts)

    def metrics(self, now: float) -> dict[str, Any]:
        """Named as docs/server.md, *Metrics*, lists them: the first ones as every Fusee
        server names them, then this server's own (throttles, concurrency, lead, p50)."""
        answers = sorted(self.answer_ms)
        return {
            "url": self.config.url,
            "types": list(self.config.types or []),
            "invocations": self.counts["sent"],
            "succeeded": self.counts["succeeded"],
            "failed": self.counts["failed"],
            "timedOut": self.counts["timed_out"],
            "unleased": self.counts["without_lease"],
            "inFlight": len(self.in_flight),
            "failuresInARow": self.failures,
            "backoffMs": max(0, int((self.backoff_until - now) * 1000)),
            "totalMs": int(self.total_ms),
            "maxMs": int(self.max_ms),
            "shards": self.counts["shards"],
            "steps": self.counts["steps"],
            "openUsTotal": int(self.open_ms * 1000),
            "opens": self.opens,
            "lastError": self.last_error,
            "throttled": self.counts["throttled"],
            "concurrency": self.concurrency,
            "leadMs": round(self.lead_s() * 1000, 1),
            "answerMsP50": answers[len(answers) // 2] if answers else None,
        }


class Observer(Protocol):
    """Told of every answer time and engine open as it happens (`/metrics`' histograms):
    the invoker itself keeps only the last few."""

    def answered(self, endpoint: str, seconds: float) -> None: ...

    def opened(self, endpoint: str, seconds: float) -> None: ...


class Shards(Protocol):
    """What the invoker asks of the server (`fusee_server.server.Server`): who holds a
    shard, what waits for one, and the two things it does to them."""

    shards: int

    def holder(self, index: int) -> ServerConnection | None: ...

    def calls_wait(self, index: int) -> bool:
        """Calls (or listings) wait at the server for `index`'s holder."""
        ...

    def calls_waiting(self) -> int: ...

    def revoke(self, conn: ServerConnection, why: str) -> None: ...

    def fail_waiting(self, index: int, before: float, why: str) -> None: ...

    def dues(self) -> list[int | None]:
        """What the store kept of each shard's due time (seam.py, `Store.dues`)."""
        ...

    def set_due(self, index: int, due_ms: int) -> None: ...


class Invoker:
    def __init__(self, server: Shards, endpoints: list[Endpoint]) -> None:
        self.server = server
        self.endpoints = [EndpointState(e) for e in endpoints]
        self.due = [Due() for _ in range(server.shards)]
        self.invocations: dict[str, Invocation] = {}
        self.counts: Counter[str] = Counter()
        self.timer: asyncio.TimerHandle | None = None
        self.kicked = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        self.observer: Observer | None = None
        self.tracing = trace_enabled()  # FUSEE_INVOKE_TRACE: a line per invocation sent and done

    def _trace(self, event: str, **fields: Any) -> None:
        if self.tracing:
            _trace.info("fusee invoke: %s %s", event, " ".join(f"{k}={v}" for k, v in fields.items()))

    def start(self) -> None:
        """A starting server invokes the shards that are due by what its store kept:
        every shard once on a data directory (their due times lived in the memory of the
        server that last heard them); on a PostgreSQL store, those held when the last
        server went, those due by now, and the others at their time (docs/postgresql.md)."""
        now, wall_ms = self.loop.time(), time.time() * 1000
        for index, due_ms in enumerate(self.server.dues()):
            if due_ms is None or due_ms == 0:
                self.make_due(index, Reason.RECOVERY)
            elif due_ms > 0:
                lead = self._choose(self.due[index]).lead_s()
                self.make_due(index, Reason.TIMER, at=now + max(0.0, (due_ms - wall_ms) / 1000 - lead))

    # -- what makes a shard due -----------------------------------------------------------

    def make_due(
        self,
        index: int,
        reason: Reason,
        at: float | None = None,
        type: str | None = None,
        trace: str | None = None,
    ) -> None:
        due = self.due[index]
        when = self.loop.time() if at is None else at
        if due.at is None or when < due.at:
            due.at = when
        due.reasons.add(reason)
        if type is not None:
            due.types.add(type)
        if trace is not None and due.trace is None:
            due.trace = trace  # the first traced start that made it due: its POST carries it
        self.kick()

    def held(self, index: int) -> None:
        """`index` has a holder now: what made it due is in its hands (the calls and
        messages that waited go to it), so nothing is due until it leaves."""
        due = self.due[index]
        due.at = None
        due.reasons.clear()
        due.trace = None

    def freed(self, index: int, holder: ServerConnection) -> None:
        """`index` lost its holder and no standby took it."""
        due = self.due[index]
        if holder.invocation is None:
            self.make_due(index, Reason.RECOVERY)  # a long-lived worker's shards: due at once
        elif not due.reported:
            # Left without reporting (a crash, a revoked lease): due again, backing off.
            self.counts["left_without_report"] += 1
            self._step_back(due, holder.invocation, self.loop.time())
            self.make_due(index, Reason.RECOVERY)
        else:
            self.kick()

    def idle(self, conn: ServerConnection, report: m.Idle) -> None:
        """An invoked worker's report on a shard it holds under `report.epoch`."""
        index = report.shard
        due = self.due[index]
        due.reported = True
        due.types.update(report.types_without_code)
        due.steps += report.steps
        invocation = self.invocations.get(conn.invocation or "")
        if invocation is not None:
            invocation.steps += report.steps
            invocation.open_ms += report.open_ms
            invocation.endpoint.opens += 1
            if invocation.connected is not None:  # an open under 0.05 ms reports 0: still an open
                ready = invocation.connected - invocation.sent + report.open_ms / 1000
                invocation.endpoint.ready_s.append(ready)
                del invocation.endpoint.ready_s[:-64]
                if self.observer is not None:
                    self.observer.opened(invocation.endpoint.config.url, report.open_ms / 1000)
        now = self.loop.time()
        if report.budget_ended and report.steps == 0 and report.heartbeats == 0:
            # A budget spent without finishing a step: a step that cannot fit in one
            # costs one invocation per backoff period, not a loop. One that heartbeated
            # progressed (its next attempt resumes from its progress): not backed off.
            self.counts["no_progress"] += 1
            self.counts["handbacks"] += 1
            stalled_s = due.stalled.step()  # not spread: one shard's own pace
            due.backoff_until = now + stalled_s
            logger.warning(
                "shard %d: an invocation's budget ended before any step finished; next try in %.0f s",
                index,
                stalled_s,
            )
            self.make_due(index, Reason.HANDBACK)
            self.server.set_due(index, 0)
            return
        due.backoff.reset()
        if report.steps:
            due.stalled.reset()
        if report.budget_ended or report.work_left:
            self.counts["handbacks"] += 1
            self.make_due(index, Reason.HANDBACK)
            self.server.set_due(index, 0)
        elif report.next_due_ms is not None:
            lead = self._choose(due).lead_s()
            self.make_due(index, Reason.TIMER, at=now + max(0.0, report.next_due_ms / 1000 - lead))
            self.server.set_due(index, int(time.time() * 1000) + report.next_due_ms)
        else:
            self.server.set_due(index, -1)
        if (
            report.types_without_code
            and invocation is not None
            and self._choose(due) is not invocation.endpoint
        ):
            # Runs this endpoint has no code for go to the endpoint that lists their type.
            self.make_due(index, Reason.CODE)
            self.server.set_due(index, 0)

    # -- invocations ----------------------------------------------------------------------

    def lookup(self, invocation_id: str) -> Invocation | None:
        return self.invocations.get(invocation_id)

    def kick(self) -> None:
        if not self.kicked:
            self.kicked = True
            self.loop.call_soon(self._dispatch)

    def _choose(self, due: Due) -> EndpointState:
        for endpoint in self.endpoints:
            if endpoint.config.types is not None and due.types & set(endpoint.config.types):
                return endpoint
        if due.last_endpoint is not None:
            return due.last_endpoint
        for endpoint in self.endpoints:
            if endpoint.config.types is None:
                return endpoint
        return self.endpoints[0]

    def _dispatch(self) -> None:
        self.kicked = False
        now = self.loop.time()
        ready: dict[EndpointState, list[int]] = {}
        probes: dict[EndpointState, list[int]] = {}
        wake: float | None = None
        for index, due in enumerate(self.due):
            if due.at is None or due.invocation is not None or self.server.holder(index) is not None:
                continue
            at = max(due.at, due.backoff_until)
            if at <= now:
                endpoint = self._choose(due)
                if endpoint.backoff_until <= now:
                    ready.setdefault(endpoint, []).append(index)
                    continue
                at = endpoint.backoff_until
                probe_at = endpoint.probe_at()
                if self.server.calls_wait(index) and endpoint.throttled_until <= now and probe_at is not None:
                    if probe_at <= now:
                        probes.setdefault(endpoint, []).append(index)
                        continue
                    at = min(at, probe_at)
            wake = at if wake is None else min(wake, at)
        for endpoint, shards in ready.items():
            free = endpoint.concurrency - len(endpoint.in_flight)
            if free <= 0:
                continue  # a slot freeing up kicks again
            per = math.ceil(len(shards) / min(free, len(shards)))
            if endpoint.config.shards:
                per = min(per, endpoint.config.shards)
            while shards and free > 0:
                batch, shards = shards[:per], shards[per:]
                self._send(endpoint, batch, now)
                free -= 1
        for endpoint, shards in probes.items():
            # One invocation for the calls waiting on an endpoint that backs off: if it
            # came up meanwhile (a server started before its function), the calls are
            # served now rather than after the backoff; if not, it costs one request.
            if len(endpoint.in_flight) < endpoint.concurrency:
                endpoint.probe = self._send(endpoint, shards[: endpoint.config.shards or None], now)
                endpoint.probed_at = now
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if wake is not None:
            self.timer = self.loop.call_at(wake, self.kick)

    def _send(self, endpoint: EndpointState, shards: list[int], now: float) -> Invocation:
        why = {reason for index in shards for reason in self.due[index].reasons}
        reasons = [reason for reason in Reason if reason in why]
        invocation = Invocation(endpoint, shards, reasons, now)
        for index in shards:
            due = self.due[index]
            due.invocation = invocation
            due.at = None
            due.sent_reasons = set(due.reasons)
            due.reasons.clear()
            due.reported = False
            due.last_endpoint = endpoint
            invocation.trace = invocation.trace or due.trace
            due.trace = None
        self.invocations[invocation.id] = invocation
        endpoint.in_flight.add(invocation)
        endpoint.counts["sent"] += 1
        endpoint.counts["shards"] += len(shards)
        self._trace(
            "send",
            invocation=invocation.id,
            url=endpoint.config.url,
            shards=shards,
            reasons=",".join(reasons),
        )
        task = self.loop.create_task(self._post(invocation))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return invocation

    async def _post(self, invocation: Invocation) -> None:
        endpoint = invocation.endpoint
        config = endpoint.config
        body = msgspec.json.encode(
            {
                "version": 1,
                "invocation": invocation.id,
                "shards": invocation.shards,
                "budgetMs": config.budget_ms,
                "reasons": invocation.reasons,
            }
        )
        headers = {"content-type": "application/json"}
        if config.secret:
            headers[HEADER] = sign(config.secret, body)
        if invocation.trace is not None:
            headers["traceparent"] = invocation.trace  # W3C: the start that made it due
        outcome = "failed"
        retry_after: float | None = None
        status = 0
        try:
            answer = await endpoint.transport.send(headers, body)
            status = answer.status
            if 200 <= status < 300:
                outcome = "succeeded" if invocation.leased else "without_lease"
            elif status in (429, 503):
                outcome = "throttled"
                retry_after = _retry_after(answer.retry_after)
            else:
                invocation.error = describe(answer)
        except TimeoutError:
            outcome = "timed_out"
        except (aiohttp.ClientError, OSError) as error:
            invocation.error = describe(Answer(0, detail=str(error) or type(error).__name__))
            logger.info("invocation %s to %s: %s", invocation.id, config.url, error)
        except Exception as error:  # noqa: BLE001  any other: a failure, never a lost _finish
            # Whatever a client library raises, the invocation must end here: without
            # _finish its shards would stay marked as being invoked, and nothing would
            # invoke them again.
            invocation.error = describe(Answer(0, detail=f"{type(error).__name__}: {error}"))
            logger.warning(
                "invocation %s to %s: %s: %s", invocation.id, config.url, type(error).__name__, error
            )
        answer_s = self.loop.time() - invocation.sent
        endpoint.answer_ms.append(answer_s * 1000)
        del endpoint.answer_ms[:-256]
        endpoint.total_ms += answer_s * 1000
        endpoint.max_ms = max(endpoint.max_ms, answer_s * 1000)
        if self.observer is not None:
            self.observer.answered(config.url, answer_s)
        if outcome == "succeeded" and invocation.conn is not None and not invocation.closed.is_set():
            # Its IDLE reports travel on the other connection: give it a moment to close.
            try:
                await asyncio.wait_for(invocation.closed.wait(), REPORT_WAIT_S)
            except TimeoutError:
                pass
        self._finish(invocation, outcome, status, retry_after)

    def _finish(self, invocation: Invocation, outcome: str, status: int, retry_after: float | None) -> None:
        endpoint = invocation.endpoint
        endpoint.in_flight.discard(invocation)
        if endpoint.probe is invocation:
            endpoint.probe = None
        endpoint.counts[outcome] += 1
        endpoint.counts["steps"] += invocation.steps
        endpoint.open_ms += invocation.open_ms
        # The ID dies with its request: a process that wakes up later cannot use it.
        del self.invocations[invocation.id]
        now = self.loop.time()
        self._trace("done", invocation=invocation.id, outcome=outcome, status=status, steps=invocation.steps)
        if outcome == "succeeded":
            endpoint.backoff.reset()
            # A failure's backoff ends with the first success (a probe's, say), so the
            # shards that wait for it go now; a throttle's pause still running stays.
            endpoint.backoff_until = min(endpoint.backoff_until, endpoint.throttled_until)
            endpoint.failures = endpoint.failed_rounds = 0
            endpoint.errors.clear()
            endpoint.successes += 1
            if (
                endpoint.concurrency < endpoint.config.concurrency
                and endpoint.successes >= SUCCESSES_PER_STEP_UP
            ):
                endpoint.concurrency += 1
                endpoint.successes = 0
        elif outcome == "throttled":
            self._throttled(endpoint, invocation, status, retry_after, now)
        else:
            self._failed(endpoint, invocation, outcome, status, now)
        conn = invocation.conn
        if conn is not None and not conn.closed:
            self.server.revoke(conn, f"its invocation {invocation.id} ended ({outcome})")
        for index in invocation.shards:
            due = self.due[index]
            if due.invocation is invocation:
                due.invocation = None
                if self.server.holder(index) is None and not due.reported:
                    # Neither held nor reported: due again for what it was sent for (a
                    # crash of its worker made it due for recovery already, backing off).
                    for reason in due.sent_reasons or {Reason.RECOVERY}:
                        self.make_due(index, reason)
        self.kick()

    def _back_off(
        self, endpoint: EndpointState, invocation: Invocation, now: float, at_least_s: float
    ) -> bool:
        """One backoff step per round of answers: invocations that were in flight together
        and fail together (an instance crashing with N requests, an endpoint down at the
        server's start) are one step, not N. True when this one took a step."""
        stepped = invocation.sent >= endpoint.backoff_set_at
        if stepped:
            endpoint.backoff.step()
            endpoint.backoff_set_at = now
        # (Never shorter than a pause still running, a throttle's Retry-After included.)
        pause = max(at_least_s, endpoint.backoff.jittered())
        endpoint.backoff_until = max(endpoint.backoff_until, now + pause)
        return stepped

    def _throttled(
        self,
        endpoint: EndpointState,
        invocation: Invocation,
        status: int,
        retry_after: float | None,
        now: float,
    ) -> None:
        """A platform's throttle is no failure of the endpoint, but it is a pause: the
        concurrency halves, and the pause grows with throttles in a row whatever
        Retry-After says (a `Retry-After: 0` answered at once would make a hot loop)."""
        endpoint.concurrency = max(1, endpoint.concurrency // 2)
        endpoint.successes = 0
        self._back_off(endpoint, invocation, now, THROTTLE_PAUSE_S if retry_after is None else retry_after)
        endpoint.throttled_until = endpoint.backoff_until
        logger.warning(
            "%s throttled invocations (%d): concurrency now %d, pausing %.1f s",
            endpoint.config.url,
            status,
            endpoint.concurrency,
            endpoint.backoff_until - now,
        )

    def _failed(
        self, endpoint: EndpointState, invocation: Invocation, outcome: str, status: int, now: float
    ) -> None:
        if outcome == "timed_out":
            config = endpoint.config
            invocation.error = (
                f"no answer within the budget and the grace ({config.budget_ms} + {config.grace_ms} ms)"
            )
        elif outcome == "without_lease":
            invocation.error = (
                f"{status}: answered without taking the lease (a fusee handler that cannot reach this "
                "server, or not a fusee handler)"
            )
        endpoint.failures += 1
        endpoint.last_error = invocation.error or outcome.replace("_", " ")
        endpoint.errors.append((now, endpoint.last_error))
        if self._back_off(endpoint, invocation, now, 0.0):
            endpoint.failed_rounds += 1
            logger.warning(
                "invocation %s to %s failed: %s; backing off %.1f s",
                invocation.id,
                endpoint.config.url,
                endpoint.errors[-1][1],
                endpoint.backoff.delay_s,
            )
        if endpoint.failed_rounds >= FAILED_ROUNDS_FOR_CALLS:
            why = f"invocations of {endpoint.config.url} fail: {endpoint.failing(now)}"
            for index in invocation.shards:
                self.server.fail_waiting(index, invocation.sent, why)

    @staticmethod
    def _step_back(due: Due, invocation: str, now: float) -> None:
        """One backoff step for the shard per crashed invocation."""
        if due.failed != invocation:
            due.failed = invocation
            due.backoff_until = max(due.backoff_until, now + due.backoff.next())

    def why_no_worker(self, index: int) -> str:
        """What a call that waited in vain for `index` is told: how its endpoint's last
        invocations went, or that one is still in flight, or that it backs off."""
        now = self.loop.time()
        due = self.due[index]
        endpoint = self._choose(due)
        parts = []
        if due.invocation is not None:
            parts.append(f"an invocation sent {now - due.invocation.sent:.1f} s ago has not answered yet")
        if endpoint.errors:
            parts.append(f"invocations of {endpoint.config.url} fail: {endpoint.failing(now)}")
        if endpoint.throttled_until > now:
            parts.append(
                f"{endpoint.config.url} throttles invocations ({endpoint.counts['throttled']} so far)"
            )
        if endpoint.backoff_until > now:
            parts.append(f"it backs off {endpoint.backoff_until - now:.1f} s more")
        if due.backoff_until > now:
            parts.append(
                f"the shard backs off {due.backoff_until - now:.1f} s more (its workers left without reporting)"
            )
        return "; ".join(parts) or f"{endpoint.config.url} was invoked and took no lease on it"

    # -- metrics --------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """The `invocations` call's answer (docs/server.md, *Metrics*)."""
        now = self.loop.time()
        due = invoking = backoff = scheduled = 0
        for d in self.due:
            if d.invocation is not None:
                invoking += 1
            elif d.backoff_until > now:
                backoff += 1
            elif d.at is not None and d.at <= now:
                due += 1
            elif d.at is not None:
                scheduled += 1
        return {
            "endpoints": [e.metrics(now) for e in self.endpoints],
            "dueShards": due,
            "invokingShards": invoking,
            "backoffShards": backoff,
            "handbacks": self.counts["handbacks"],
            "crashes": self.counts["left_without_report"],
            "noProgress": self.counts["no_progress"],
            "parkedCalls": self.server.calls_waiting(),
            "scheduledShards": scheduled,
            "overdue": self._overdue(now),
        }

    def _overdue(self, now: float) -> int:
        """Shards due over OVERDUE_S ago and not invoked though their endpoint could take
        them: a lost wake-up made visible."""
        count = 0
        for index, d in enumerate(self.due):
            if d.at is None or d.invocation is not None or self.server.holder(index) is not None:
                continue
            endpoint = self._choose(d)
            if (
                now - max(d.at, d.backoff_until) > OVERDUE_S
                and endpoint.backoff_until <= now
                and len(endpoint.in_flight) < endpoint.concurrency
            ):
                count += 1
        return count

    async def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for task in list(self.tasks):
            task.cancel()
        for endpoint in self.endpoints:
            if isinstance(endpoint.transport, HttpTransport):
                await endpoint.transport.close()
            else:
                endpoint.transport.close()


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: the default pause is near enough
    return seconds if 0 <= seconds <= 300 else None
