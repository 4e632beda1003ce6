"""The invoker: when a shard has work and no worker, POST a signed request to an
endpoint whose handler opens an engine for it (spec: Invoked workers), or hand the same
request to the Lambda Invoke API for a `lambda:` endpoint (lambda_invoke.py).

A shard is due when no worker holds it and a call or a message waits for it, its last
holder's reported next due time comes, its holder left without reporting, or the server
started. Due shards are spread over each endpoint's free concurrency, each invocation
under a fresh ID that is valid until its request is answered: a process that wakes up
after that can neither connect with it nor write under its epochs. Failures back off, per
endpoint and per shard; a platform's throttle (429, 503) lowers the endpoint's
concurrency instead, and it climbs back with successes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import secrets
import ssl
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import msgspec

from fusee.protocol import messages as m
from fusee.protocol.signature import HEADER, sign
from fusee_server import lambda_invoke
from fusee_server.invoke_config import Endpoint
from fusee_server.lambda_invoke import LambdaTransport

if TYPE_CHECKING:
    from fusee_server.listener import ServerConnection
    from fusee_server.server import Server

logger = logging.getLogger("fusee.invoker")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 30.0
JITTER = 0.2  # a fifth
NO_PROGRESS_FIRST_S = 1.0
NO_PROGRESS_MAX_S = 300.0
REPORT_WAIT_S = 1.0  # after a 2xx, how long the worker's connection may take to close
OVERDUE_S = 1.0
SUCCESSES_PER_STEP_UP = 4  # a throttled endpoint climbs back one slot per this many
LEAD_MIN_S = 0.005
LEAD_MAX_S = 0.2  # under the worker's 250 ms: it stays for a timer this close


def trace(event: str, **fields: Any) -> None:
    if os.environ.get("FUSEE_INVOKE_TRACE") == "1":
        detail = " ".join(f"{k}={v}" for k, v in fields.items())
        print(f"fusee invoke: {event} {detail}", file=sys.stderr, flush=True)


def jittered(delay: float) -> float:
    return delay * (1 + random.uniform(-JITTER, JITTER))


class Due:
    """One shard's invoking state."""

    def __init__(self) -> None:
        self.at: float | None = None  # loop time it is due at (None: nothing due)
        self.reasons: set[str] = set()
        self.types: set[str] = set()  # workflow types it has work of (start calls, no code)
        self.backoff_until = 0.0
        self.backoff_s = 0.0  # its holder left without reporting (doubles)
        # The invocation whose failure last stepped `backoff_s`: a crashed invocation is
        # seen twice (its connection closes, then its request fails) and is one failure.
        self.failed: str | None = None
        self.stalled_s = 0.0  # invocations without progress (doubles)
        self.invocation: Invocation | None = None
        self.last_endpoint: EndpointState | None = None
        self.reported = False  # its last invoked holder sent IDLE for its lease


class Invocation:
    def __init__(self, endpoint: EndpointState, shards: list[int], reasons: list[str], now: float) -> None:
        self.id = secrets.token_hex(8)
        self.endpoint = endpoint
        self.shards = shards
        self.reasons = reasons
        self.sent = now
        self.conn: ServerConnection | None = None
        self.connected: float | None = None  # when its worker connected (loop time)
        self.leased = False
        self.steps = 0
        self.open_ms = 0.0
        self.closed = asyncio.Event()  # its worker's connection is gone

    def budget_left_ms(self, now: float) -> int:
        return max(0, int(self.endpoint.config.budget_ms - (now - self.sent) * 1000))


class EndpointState:
    def __init__(self, config: Endpoint) -> None:
        self.config = config
        self.in_flight: set[Invocation] = set()
        self.concurrency = config.concurrency  # lowered by throttles, climbing back
        self.successes = 0
        self.backoff_s = 0.0
        self.backoff_until = 0.0
        self.backoff_set_at = -1.0  # when the backoff last grew (loop time)
        self.counts: Counter[str] = Counter()
        self.open_ms = 0.0  # the engines' open time, summed
        self.answer_ms: list[float] = []  # the last 256 times from sending to the answer
        self.ready_s: list[float] = []  # the last 64 times from sending to an engine being open
        self.session: aiohttp.ClientSession | None = None
        # A lambda: endpoint calls the Invoke API instead of POSTing (boto3 loads here, at
        # the start, so the first invocations do not wait for it).
        self.transport = LambdaTransport(config) if lambda_invoke.is_lambda(config.url) else None

    def lead_s(self) -> float:
        """How much before a timer to invoke for it: the time this endpoint usually takes
        from the request to an open engine (p90), and a little more. The woken worker
        waits out the rest itself (a timer due within 250 ms keeps it from leaving)."""
        if not self.ready_s:
            return LEAD_MIN_S
        ready = sorted(self.ready_s)
        return min(LEAD_MAX_S, ready[int(len(ready) * 0.9)] + LEAD_MIN_S)

    def metrics(self, now: float) -> dict[str, Any]:
        answers = sorted(self.answer_ms)
        return {
            "url": self.config.url,
            "sent": self.counts["sent"],
            "succeeded": self.counts["succeeded"],
            "failed": self.counts["failed"],
            "timedOut": self.counts["timed_out"],
            "withoutLease": self.counts["without_lease"],
            "throttled": self.counts["throttled"],
            "inFlight": len(self.in_flight),
            "backoffMs": max(0, int((self.backoff_until - now) * 1000)),
            "answerMsP50": answers[len(answers) // 2] if answers else None,
            "answerMsMax": answers[-1] if answers else None,
            "shardsInvoked": self.counts["shards"],
            "steps": self.counts["steps"],
            "openMs": round(self.open_ms, 1),
            "leadMs": round(self.lead_s() * 1000, 1),
            "concurrency": self.concurrency,
        }


class Observer(Protocol):
    """Told of every answer time and engine open as it happens (`/metrics`' histograms):
    the invoker itself keeps only the last few."""

    def answered(self, endpoint: str, seconds: float) -> None: ...

    def opened(self, endpoint: str, seconds: float) -> None: ...


class Invoker:
    def __init__(self, server: Server, endpoints: list[Endpoint]) -> None:
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

    def start(self) -> None:
        """A starting server invokes every shard once: their due times lived in the
        memory of the server that last heard them."""
        for index in range(self.server.shards):
            self.make_due(index, "start")

    # -- what makes a shard due -----------------------------------------------------------

    def make_due(self, index: int, reason: str, at: float | None = None, type: str | None = None) -> None:
        due = self.due[index]
        when = self.loop.time() if at is None else at
        if due.at is None or when < due.at:
            due.at = when
        due.reasons.add(reason)
        if type is not None:
            due.types.add(type)
        self.kick()

    def held(self, index: int) -> None:
        """`index` has a holder now: what made it due is in its hands (the calls and
        messages that waited go to it), so nothing is due until it leaves."""
        due = self.due[index]
        due.at = None
        due.reasons.clear()

    def freed(self, index: int, holder: ServerConnection) -> None:
        """`index` lost its holder and no standby took it."""
        due = self.due[index]
        if holder.invocation is None:
            self.make_due(index, "left")  # a long-lived worker's shards: due at once
        elif not due.reported:
            # Left without reporting (a crash, a revoked lease): due again, backing off.
            self.counts["left_without_report"] += 1
            self._step_back(due, holder.invocation, self.loop.time())
            self.make_due(index, "left")
        else:
            self.kick()

    def idle(self, conn: ServerConnection, report: m.Idle) -> None:
        """An invoked worker's report on a shard it holds under `report.epoch`."""
        index = report.shard
        due = self.due[index]
        due.reported = True
        due.types.update(report.types_without_code)
        invocation = self.invocations.get(conn.invocation or "")
        if invocation is not None:
            invocation.steps += report.steps
            invocation.open_ms += report.open_ms
            if invocation.connected is not None:  # an open under 0.05 ms reports 0: still an open
                ready = invocation.connected - invocation.sent + report.open_ms / 1000
                invocation.endpoint.ready_s.append(ready)
                del invocation.endpoint.ready_s[:-64]
                if self.observer is not None:
                    self.observer.opened(invocation.endpoint.config.url, report.open_ms / 1000)
        now = self.loop.time()
        if report.budget_ended and report.steps == 0:
            # A budget spent without finishing a step: a step that cannot fit in one
            # costs one invocation per backoff period, not a loop.
            self.counts["no_progress"] += 1
            due.stalled_s = min(NO_PROGRESS_MAX_S, due.stalled_s * 2 or NO_PROGRESS_FIRST_S)
            due.backoff_until = now + due.stalled_s
            logger.warning(
                "shard %d: an invocation's budget ended before any step finished; next try in %.0f s",
                index,
                due.stalled_s,
            )
            self.make_due(index, "handback")
            return
        due.backoff_s = 0.0
        if report.steps:
            due.stalled_s = 0.0
        if report.budget_ended:
            self.counts["handbacks"] += 1
            self.make_due(index, "handback")
        elif report.work_left:
            self.make_due(index, "work")
        elif report.next_due_ms is not None:
            lead = self._choose(due).lead_s()
            self.make_due(index, "timer", at=now + max(0.0, report.next_due_ms / 1000 - lead))

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
        wake: float | None = None
        for index, due in enumerate(self.due):
            if due.at is None or due.invocation is not None or self.server.slots[index].holder is not None:
                continue
            at = max(due.at, due.backoff_until)
            if at > now:
                wake = at if wake is None else min(wake, at)
                continue
            endpoint = self._choose(due)
            if endpoint.backoff_until > now:
                wake = endpoint.backoff_until if wake is None else min(wake, endpoint.backoff_until)
                continue
            ready.setdefault(endpoint, []).append(index)
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
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if wake is not None:
            self.timer = self.loop.call_at(wake, self.kick)

    def _send(self, endpoint: EndpointState, shards: list[int], now: float) -> None:
        reasons = sorted({reason for index in shards for reason in self.due[index].reasons})
        invocation = Invocation(endpoint, shards, reasons, now)
        for index in shards:
            due = self.due[index]
            due.invocation = invocation
            due.at = None
            due.reasons.clear()
            due.reported = False
            due.last_endpoint = endpoint
        self.invocations[invocation.id] = invocation
        endpoint.in_flight.add(invocation)
        endpoint.counts["sent"] += 1
        endpoint.counts["shards"] += len(shards)
        trace(
            "send",
            invocation=invocation.id,
            url=endpoint.config.url,
            shards=shards,
            reasons=",".join(reasons),
        )
        task = self.loop.create_task(self._post(invocation))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _session(self, endpoint: EndpointState) -> aiohttp.ClientSession:
        if endpoint.session is None:
            context: ssl.SSLContext | bool = True
            config = endpoint.config
            if config.ca is not None or config.cert is not None:
                context = ssl.create_default_context(cafile=config.ca)
                if config.cert is not None:
                    context.load_cert_chain(config.cert, config.key)
            endpoint.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
        return endpoint.session

    async def _post_http(
        self, endpoint: EndpointState, headers: dict[str, str], body: bytes
    ) -> tuple[int, str | None]:
        """The status and Retry-After of a POST to the endpoint's URL."""
        config = endpoint.config
        timeout = aiohttp.ClientTimeout(total=(config.budget_ms + config.grace_ms) / 1000)
        async with self._session(endpoint).post(
            config.url, data=body, headers=headers, timeout=timeout
        ) as response:
            await response.read()
            return response.status, response.headers.get("retry-after")

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
        outcome = "failed"
        retry_after: float | None = None
        status = 0
        try:
            if endpoint.transport is not None:
                status, retry_header = await endpoint.transport.send(headers, body)
            else:
                status, retry_header = await self._post_http(endpoint, headers, body)
            if 200 <= status < 300:
                outcome = "succeeded" if invocation.leased else "without_lease"
            elif status in (429, 503):
                outcome = "throttled"
                retry_after = _retry_after(retry_header)
        except TimeoutError:
            outcome = "timed_out"
        except (aiohttp.ClientError, OSError) as error:
            logger.info("invocation %s to %s: %s", invocation.id, config.url, error)
        except Exception as error:  # noqa: BLE001  any other: a failure, never a lost _finish
            # Whatever a client library raises, the invocation must end here: without
            # _finish its shards would stay marked as being invoked, and nothing would
            # invoke them again.
            logger.warning(
                "invocation %s to %s: %s: %s", invocation.id, config.url, type(error).__name__, error
            )
        answer_s = self.loop.time() - invocation.sent
        endpoint.answer_ms.append(answer_s * 1000)
        del endpoint.answer_ms[:-256]
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
        endpoint.counts[outcome] += 1
        endpoint.counts["steps"] += invocation.steps
        endpoint.open_ms += invocation.open_ms
        # The ID dies with its request: a process that wakes up later cannot use it.
        del self.invocations[invocation.id]
        now = self.loop.time()
        trace("done", invocation=invocation.id, outcome=outcome, status=status, steps=invocation.steps)
        if outcome == "succeeded":
            endpoint.backoff_s = 0.0
            endpoint.successes += 1
            if (
                endpoint.concurrency < endpoint.config.concurrency
                and endpoint.successes >= SUCCESSES_PER_STEP_UP
            ):
                endpoint.concurrency += 1
                endpoint.successes = 0
        elif outcome == "throttled":
            endpoint.concurrency = max(1, endpoint.concurrency // 2)
            endpoint.successes = 0
            endpoint.backoff_until = now + (retry_after if retry_after is not None else 1.0)
            logger.warning(
                "%s throttled invocations (%d): concurrency now %d",
                endpoint.config.url,
                status,
                endpoint.concurrency,
            )
        elif invocation.sent >= endpoint.backoff_set_at:
            # One step per failure seen after the last step was taken: invocations that
            # were in flight together and fail together (an instance crashing with N
            # requests, an endpoint down at the server's start) are one failure, not N.
            endpoint.backoff_s = min(BACKOFF_MAX_S, endpoint.backoff_s * 2 or BACKOFF_FIRST_S)
            endpoint.backoff_set_at = now
            # (Never shorter than a throttle's Retry-After still running.)
            endpoint.backoff_until = max(endpoint.backoff_until, now + jittered(endpoint.backoff_s))
            logger.warning(
                "invocation %s to %s %s (status %s); backing off %.1f s",
                invocation.id,
                endpoint.config.url,
                outcome.replace("_", " "),
                status or "none",
                endpoint.backoff_s,
            )
        conn = invocation.conn
        if conn is not None and not conn.closed:
            self.server.revoke(conn, f"its invocation {invocation.id} ended ({outcome})")
        for index in invocation.shards:
            due = self.due[index]
            if due.invocation is invocation:
                due.invocation = None
                if self.server.slots[index].holder is None and not due.reported:
                    if outcome in ("succeeded", "throttled"):
                        self.make_due(index, "retry")
                    else:
                        self._step_back(due, invocation.id, now)
                        self.make_due(index, "retry")
        self.kick()

    @staticmethod
    def _step_back(due: Due, invocation: str, now: float) -> None:
        """One backoff step for the shard per failed invocation."""
        if due.failed != invocation:
            due.failed = invocation
            due.backoff_s = min(BACKOFF_MAX_S, due.backoff_s * 2 or BACKOFF_FIRST_S)
            due.backoff_until = max(due.backoff_until, now + jittered(due.backoff_s))

    # -- metrics --------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        now = self.loop.time()
        due = [d for d in self.due if d.at is not None]
        return {
            "endpoints": [e.metrics(now) for e in self.endpoints],
            "shardsDue": sum(1 for d in due if d.invocation is None and d.at is not None and d.at <= now),
            "shardsScheduled": sum(
                1 for d in due if d.invocation is None and d.at is not None and d.at > now
            ),
            "invoking": sum(1 for d in self.due if d.invocation is not None),
            "inBackoff": sum(1 for d in due if d.backoff_until > now),
            "overdue": sum(
                1
                for index, d in enumerate(self.due)
                if d.at is not None
                and d.invocation is None
                and self.server.slots[index].holder is None
                and now - max(d.at, d.backoff_until) > OVERDUE_S
                and self._choose(d).backoff_until <= now
                and len(self._choose(d).in_flight) < self._choose(d).concurrency
            ),
            "handbacks": self.counts["handbacks"],
            "leftWithoutReport": self.counts["left_without_report"],
            "withoutProgress": self.counts["no_progress"],
            "callsWaiting": self.server.calls_waiting(),
        }

    async def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for task in list(self.tasks):
            task.cancel()
        for endpoint in self.endpoints:
            if endpoint.session is not None:
                await endpoint.session.close()
            if endpoint.transport is not None:
                endpoint.transport.close()


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: the default pause is near enough
    return seconds if 0 <= seconds <= 300 else None
