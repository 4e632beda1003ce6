"""Traces through OpenTelemetry: `Engine.open(telemetry=fusee.open_telemetry())`.

This is the only module that imports `opentelemetry`, and nothing imports it until
`fusee.open_telemetry()` is called: with telemetry off the engine holds `None` where it
would hold a `Telemetry`, and its step path pays one `is not None` test per attempt.

A run's trace is the W3C `traceparent` its start recorded (`Started.traceparent`), so
every process that runs the run, after a crash, a failover or a handback, continues the
same trace: each gets its own `fusee.workflow` span for the stretch of the run it holds
(a run loaded or started here, until it ends, parks or is let go of), and a
`fusee.step` span per attempt it runs below that. Replayed steps make no span: their
attempts already ran, and were traced by the process that ran them. Spans are made only
for what runs live, never from workflow code itself (that code runs again at every
replay, and would trace the same work again each time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fusee import journal as R
from fusee._errors import Failure
from fusee.journal import Status as RunStatus

if TYPE_CHECKING:
    from fusee.workflow.ops import StepOp

# W3C trace context, whatever propagator the application installed globally: the
# traceparent is what the journal records, so its format is fixed.
_W3C = TraceContextTextMapPropagator()
_ERRORS = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT})


class RunState(Protocol):
    """What tracing reads of a run (`fusee.engine.run.RunState`)."""

    wid: str
    run_no: int
    type: str
    started: R.Started
    status: RunStatus
    final: bool

    def outcome_failure(self) -> Failure | None: ...


def open_telemetry(tracer_provider: TracerProvider | None = None) -> Telemetry:
    """Telemetry for `Engine.open(telemetry=)`, `Client.connect(telemetry=)` and
    `invocation_handler(telemetry=)`, through the application's tracer provider (the global
    one by default). Fusee installs no provider and no exporter: the application owns them."""
    from fusee import __version__

    return Telemetry(trace.get_tracer("fusee", __version__, tracer_provider=tracer_provider))


def traceparent_of(span: Span) -> str | None:
    """A span's W3C `traceparent`, or None for a span that is not recording a trace."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


class Telemetry:
    """The tracer a process's engine (or client) traces with."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def traceparent(self) -> str | None:
        """The active span's `traceparent`: what a start records (None: no active span)."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        return carrier.get("traceparent")

    def run_trace(self, run: RunState, shard: int) -> RunTrace:
        """A `fusee.workflow` span for a run whose code goes live in this process, a child
        of the span its start recorded (a root span when its start recorded none)."""
        recorded = run.started.traceparent
        parent = _W3C.extract({"traceparent": recorded}) if recorded else None
        span = self.tracer.start_span(
            "fusee.workflow",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "fusee.workflow.id": run.wid,
                "fusee.workflow.type": run.type,
                "fusee.workflow.run": run.run_no,
                "fusee.shard": shard,
            },
        )
        return RunTrace(self.tracer, span)


class RunTrace:
    """One run's `fusee.workflow` span in this process, and its attempts' spans in flight."""

    __slots__ = ("context", "outside", "span", "steps", "tracer")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self.tracer = tracer
        self.span = span
        self.outside = True  # False while `attempt` runs one under its span
        self.context = trace.set_span_in_context(span)
        self.steps: dict[int, Span] = {}  # position -> the span of its attempt running

    def traceparent(self) -> str | None:
        return traceparent_of(self.span)

    def attempt(self, execute: Callable[[Any, StepOp], None], run: RunState, op: StepOp) -> None:
        """Run one attempt (`execute`) under a `fusee.step` span: the step's function (on
        the loop, a task or a thread, each of which copies the current context) sees it
        as the active span, so the calls it makes are traced below it."""
        if op.done or run.final:
            self.outside = False
            try:
                execute(run, op)  # nothing runs: no span
            finally:
                self.outside = True
            return
        span = self.tracer.start_span(
            "fusee.step",
            context=self.context,
            kind=SpanKind.INTERNAL,
            attributes={
                "fusee.workflow.id": run.wid,
                "fusee.workflow.type": run.type,
                "fusee.step.name": op.name,
                "fusee.step.attempt": op.attempt,
                "fusee.step.position": op.seq,
            },
        )
        previous = self.steps.pop(op.seq, None)
        if previous is not None:  # an attempt that never reported (a timed-out thread)
            previous.end()
        self.steps[op.seq] = span
        token = otel_context.attach(trace.set_span_in_context(span, self.context))
        self.outside = False
        try:
            execute(run, op)
        finally:
            self.outside = True
            otel_context.detach(token)

    def step_ended(self, op: StepOp, exc: BaseException | None, *, cancelled: bool = False) -> None:
        """An attempt ended: with its function's failure `exc`, or cancelled with its run
        (or let go of with its shard)."""
        span = self.steps.pop(op.seq, None)
        if span is None:
            return
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        elif cancelled:
            span.set_attribute("fusee.step.cancelled", True)
        span.end()

    def end(self, run: RunState) -> None:
        """The run left this process's hands: it ended, parked, or its shard was let go of
        (attempts still running are ended with it: their outcome is not recorded here)."""
        for span in self.steps.values():
            span.set_attribute("fusee.step.cancelled", True)
            span.end()
        self.steps.clear()
        span = self.span
        status = run.status
        span.set_attribute("fusee.workflow.status", str(status))
        if status in _ERRORS:
            failure = run.outcome_failure()
            span.set_status(Status(StatusCode.ERROR, failure.message if failure is not None else str(status)))
        span.end()
