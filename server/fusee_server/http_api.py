"""`fusee server --http HOST:PORT`: the HTTP API (`/v1`, http_runs.py), the web UI at `/`
(ui/), `/metrics` in the Prometheus text format and `/healthz`, served by aiohttp on the
server's own event loop, behind http_guard.py's checks.

Most numbers are read from the server's and the invoker's state when Prometheus scrapes
(`StateCollector`), so nothing is counted twice and an idle server does no metrics work.
The two histograms cannot be read that way: the invoker keeps only its last few answer
times (enough for its p50 and its timer lead), and a histogram needs every observation,
so the invoker feeds them as each invocation is answered and each IDLE report arrives
(`Metrics` is its `observer`).

With the server's token (`--token-file`) every path wants `Authorization: Bearer
<token>`: the worker token, a client token (`--client-token-file`) or a read token
(`--read-token-file`), the one to give a scraper, since it cannot lease shards. A read
token may only GET (a change answers 403). With the server's TLS settings every path is
served over the same TLS.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from fusee.engine.shard_metrics import DOCS
from fusee_server.access import Tokens
from fusee_server.http_guard import Guard, is_loopback
from fusee_server.http_objects import OBJECT_ROUTES
from fusee_server.http_runs import RelayCalls, RunsApi
from fusee_server.ui import WebUi, server_shards

if TYPE_CHECKING:
    from fusee_server.invoker import EndpointState, Invoker
    from fusee_server.server import Server

# From a warm endpoint's tens of milliseconds to the longest budget a platform allows
# (15 min) plus its grace.
ANSWER_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
# A shard's open is its recovery: a fraction of a millisecond for a small shard, seconds
# for one holding hundreds of thousands of runs.
OPEN_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# How an invocation ended, as `EndpointState.counts` names it (docs/server.md, *Invoking
# workers*, **Metrics**); a throttle (429, 503) is counted apart from a failure, as the invoker treats it.
OUTCOMES = ("succeeded", "failed", "timed_out", "without_lease", "throttled")
NOT_OUTCOMES = {"sent", "shards", "steps"}  # the other keys of `EndpointState.counts`
SHUTDOWN_S = 1.0  # a scrape is answered at once: no need to wait long for one in flight


class Metrics:
    """The server's own registry (not prometheus_client's global one, so two servers in
    one process, as in tests, never share series): the state collector and the two
    histograms."""

    def __init__(self, server: Server) -> None:
        self.registry = CollectorRegistry()
        self.answer = Histogram(
            "fusee_invocation_answer_seconds",
            "Time from sending an invocation to its endpoint's answer (or the request failing).",
            ["endpoint"],
            buckets=ANSWER_BUCKETS_S,
            registry=self.registry,
        )
        self.open = Histogram(
            "fusee_invoked_shard_open_seconds",
            "Time an invoked worker's engine took to open a shard (its recovery), per IDLE report.",
            ["endpoint"],
            buckets=OPEN_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(StateCollector(server))

    def watch(self, invoker: Invoker) -> None:
        """Become `invoker`'s observer. Each endpoint's series exist from the start, at
        zero: a rate over a series that appears with its first observation misses it."""
        invoker.observer = self
        for endpoint in invoker.endpoints:
            self.answer.labels(endpoint.config.url)
            self.open.labels(endpoint.config.url)

    def answered(self, endpoint: str, seconds: float) -> None:
        self.answer.labels(endpoint).observe(seconds)

    def opened(self, endpoint: str, seconds: float) -> None:
        self.open.labels(endpoint).observe(seconds)

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The text format, or OpenMetrics when the scraper asks for it."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


class StateCollector(Collector):
    """Reads the server and its invoker at each scrape. Runs on the event loop, as every
    change to what it reads does, so a scrape sees one consistent moment."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        yield from self._server()
        yield from self._shards()
        backup = self.server.store.backup
        if backup is not None:
            yield from self._backup(backup.status())
        if self.server.invoker is not None:
            yield from self._invoker(self.server.invoker)

    def _shards(self) -> Iterator[Metric]:
        """`fusee_<counter>{shard="N"}` for the counters the server sees of each shard
        (docs/telemetry.md, *Metrics per shard*): what its holders appended and flushed,
        its checkpoints, and the steps its invoked holders reported. Untyped, so that each
        is exposed under its own name (a counter would gain `_total`)."""
        counts = self.server.store.counts
        invoker = self.server.invoker
        names = ["records", "bytes", "flushes", "flushed_records", "flush_us", "checkpoints"]
        for name in names:
            family = UnknownMetricFamily(f"fusee_{name}", DOCS[name], labels=["shard"])
            for index, row in enumerate(counts):
                family.add_metric([str(index)], row[name])
            yield family
        if invoker is not None:
            family = UnknownMetricFamily(
                "fusee_steps_executed", "Step attempts invoked workers reported running.", labels=["shard"]
            )
            for index, due in enumerate(invoker.due):
                family.add_metric([str(index)], due.steps)
            yield family

    def _backup(self, status: dict[str, Any]) -> Iterator[Metric]:
        """The continuous backup (docs/backup.md): how far behind the log it is."""
        yield GaugeMetricFamily(
            "fusee_backup_lag_seconds",
            "Seconds since the newest restore point, while the log holds records past it (0: caught up).",
            value=status["lag_s"],
        )
        yield GaugeMetricFamily(
            "fusee_backup_failing", "1 while uploads to the backup target fail.", value=int(status["failing"])
        )
        yield CounterMetricFamily(
            "fusee_backup_uploads", "Objects uploaded to the backup target.", status["uploads"]
        )
        yield CounterMetricFamily(
            "fusee_backup_uploaded_bytes", "Bytes uploaded to the backup target.", status["uploaded_bytes"]
        )

    def _server(self) -> Iterator[Metric]:
        server = self.server
        yield GaugeMetricFamily("fusee_shards", "Shards of the data directory.", value=server.shards)
        yield GaugeMetricFamily(
            "fusee_shards_held",
            "Shards a worker (long-lived or invoked) holds a lease on.",
            value=sum(1 for lease in server.leases.table if lease.holder is not None),
        )
        workers = GaugeMetricFamily(
            "fusee_workers_connected",
            "Workers connected: long-lived ones (standbys included) and invoked ones.",
            labels=["kind"],
        )
        invoked = sum(1 for conn in server.leases.connections if conn.invocation is not None)
        workers.add_metric(["long_lived"], len(server.leases.workers))
        workers.add_metric(["invoked"], invoked)
        yield workers
        yield GaugeMetricFamily(
            "fusee_connections_open",
            "Connections open: workers, their pingers and clients.",
            value=len(server.leases.connections),
        )
        yield GaugeMetricFamily(
            "fusee_calls_in_flight",
            "Client calls relayed to a worker and not answered yet.",
            value=len(server.relay.calls),
        )
        yield GaugeMetricFamily(
            "fusee_calls_waiting",
            "Client calls waiting at the server for their shard to get a holder.",
            value=server.calls_waiting(),
        )

    def _invoker(self, invoker: Invoker) -> Iterator[Metric]:
        now = invoker.loop.time()
        yield from self._endpoints(invoker.endpoints, now)
        # The shard counts (overdue above all) are the ones the `invocations` call gives:
        # computed once, in the invoker, so the two never disagree.
        overall = invoker.metrics()
        for name, key, doc in (
            ("fusee_shards_due", "dueShards", "Shards due now with no invocation sent for them yet."),
            ("fusee_shards_scheduled", "scheduledShards", "Shards with a due time still to come."),
            ("fusee_shards_invoking", "invokingShards", "Shards an invocation in flight carries."),
            ("fusee_shards_in_backoff", "backoffShards", "Shards held back by their own backoff."),
            (
                "fusee_shards_overdue",
                "overdue",
                "Shards due for over a second and not invoked though their endpoint could take them.",
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=overall[key])
        for name, key, doc in (
            ("fusee_handbacks", "handbacks", "Shards an invoked worker handed back when its budget ended."),
            (
                "fusee_invoked_left_without_report",
                "crashes",
                "Leases of invoked workers that ended without an IDLE report (a crash, a revoke).",
            ),
            (
                "fusee_invocations_without_progress",
                "noProgress",
                "Budgets that ended before any step finished on a shard (the shard backs off).",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=overall[key])

    @staticmethod
    def _endpoints(endpoints: list[EndpointState], now: float) -> Iterator[Metric]:
        label = ["endpoint"]
        sent = CounterMetricFamily("fusee_invocations_sent", "Invocations sent.", labels=label)
        ended = CounterMetricFamily(
            "fusee_invocations",
            "Invocations answered or failed, by how they ended.",
            labels=[*label, "outcome"],
        )
        in_flight = GaugeMetricFamily(
            "fusee_invocations_in_flight", "Invocations sent and not answered yet.", labels=label
        )
        backoff = GaugeMetricFamily(
            "fusee_endpoint_backoff_seconds", "Time left before the endpoint is invoked again.", labels=label
        )
        concurrency = GaugeMetricFamily(
            "fusee_endpoint_concurrency",
            "Invocations the endpoint may have at once now (lowered by throttles).",
            labels=label,
        )
        configured = GaugeMetricFamily(
            "fusee_endpoint_concurrency_configured", "The endpoint's configured concurrency.", labels=label
        )
        shards = CounterMetricFamily(
            "fusee_invoked_shards", "Shards carried by the invocations sent.", labels=label
        )
        steps = CounterMetricFamily(
            "fusee_invoked_steps",
            "Steps invoked workers ran, counted as their invocation ends.",
            labels=label,
        )
        for endpoint in endpoints:
            url = endpoint.config.url
            sent.add_metric([url], endpoint.counts["sent"])
            # Every known outcome from the start (at zero), and any other the invoker counts.
            others = sorted(set(endpoint.counts) - set(OUTCOMES) - NOT_OUTCOMES)
            for outcome in (*OUTCOMES, *others):
                ended.add_metric([url, outcome], endpoint.counts[outcome])
            in_flight.add_metric([url], len(endpoint.in_flight))
            backoff.add_metric([url], max(0.0, endpoint.backoff_until - now))
            concurrency.add_metric([url], endpoint.concurrency)
            configured.add_metric([url], endpoint.config.concurrency)
            shards.add_metric([url], endpoint.counts["shards"])
            steps.add_metric([url], endpoint.counts["steps"])
        yield from (sent, ended, in_flight, backoff, concurrency, configured, shards, steps)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpApi:
    """The HTTP site: `/v1` (http_runs.py), `/metrics`, `/backup` and `/healthz`, behind the guard
    (http_guard.py). It is closed after the server stops, so `/healthz` answers 503
    while the stop flushes and closes the log rather than refusing connections."""

    def __init__(
        self,
        server: Server,
        tokens: Tokens,
        tls: bool = False,
        identity_header: str | None = None,
        codec_url: str | None = None,
    ) -> None:
        self.server = server
        self.tokens = tokens
        self.metrics = Metrics(server)
        self.guard = Guard(tokens, tls, identity_header)
        self.calls = RelayCalls(server.relay, server.shards)
        self.runs = RunsApi(self.calls, invoker=lambda: server.invoker is not None)
        app = self.runs.app(self.guard, OBJECT_ROUTES)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/backup", self._backup)
        WebUi(self.runs, server_shards(server), codec_url=codec_url).add_to(app, self.guard)
        # No access log: a line per scrape every few seconds would bury the lease events.
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)

    async def start(self, sockets: list[socket.socket], tls: ssl.SSLContext | None) -> int:
        """Serve on `sockets`, bound by the start's checks (so a port in use stopped the
        start before anything opened); the port of the first. Raises OSError."""
        await self.runner.setup()
        for sock in sockets:
            await web.SockSite(self.runner, sock, ssl_context=tls).start()
        port = int(sockets[0].getsockname()[1])
        if self.tokens.worker is None and all(is_loopback(sock.getsockname()[0]) for sock in sockets):
            self.guard.local_port = port  # open, on loopback: this machine's names only
        return port

    async def close(self) -> None:
        self.calls.close()
        await self.runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _backup(self, request: web.Request) -> web.Response:
        """The continuous backup's status (docs/backup.md): its target and timeline, the
        lag, whether uploads fail and why. 404 when the server has none."""
        backup = self.server.store.backup
        if backup is None:
            return web.json_response(
                {"error": "no backup configured (fusee server --backup URL)"}, status=404
            )
        status = backup.status()
        if status["lag_s"] == float("inf"):
            status["lag_s"] = None  # JSON has no infinity: no restore point yet
        return web.json_response(status)

    async def _healthz(self, request: web.Request) -> web.Response:
        # `stopped` is set by SIGTERM and by a failed log write: from then on the log
        # takes nothing more.
        if self.server.stopped.is_set():
            return web.json_response({"status": "stopping"}, status=503)
        return web.json_response({"status": "serving", "shards": self.server.shards})
