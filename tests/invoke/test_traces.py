"""Traces across invoked workers (docs/telemetry.md), every part a real process: a client
with telemetry starts a run inside its own span, `fusee server` invokes uvicorn serving
tests/invoke/traced_app.py (the ready-made handler, FUSEE_TELEMETRY=otel), the handler is
SIGKILLed mid-run and budgets end mid-run. The run's spans, from every process that ran
it, are in the client's trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fusee
from tests.support.cluster import Cluster, Handler, quiet
from tests.support.procs import Proc, retry, steps_seen
from tests.support.waiting import eventually

STEPS = 60  # about 30 ms each: longer than a budget of 1 s after the kill


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_one_trace_spans_the_client_the_workflow_and_each_attempt_across_a_kill_and_handbacks(cluster):
    spans = cluster.root / "spans.jsonl"
    env = {**cluster.handler_env(), "FUSEE_TELEMETRY": "otel", "FUSEE_TEST_SPANS": str(spans)}
    cluster.start_handler(lambda: Handler(cluster.handler_port, env, "tests.invoke.traced_app:app"))
    cluster.start_invoked_config(budgetMs=1000, graceMs=1000)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = await retry(
        lambda: fusee.Client.connect(cluster.host_port, telemetry=fusee.open_telemetry(provider))
    )
    await quiet(client)  # the first invocations (every shard) are over: the start's comes next

    with provider.get_tracer("tests").start_as_current_span("checkout request") as request:
        await client.start("steps", "traced-1", STEPS)
    await eventually(lambda: len(steps_seen(cluster.steps)) >= 10, timeout=30.0, every=0.02)
    killed = cluster.handler
    assert killed is not None
    fresh = cluster.kill_handler()  # a fresh process serves the same URL, as a platform's would
    result = await retry(lambda: client.run("traced-1").result(), timeout=60)
    assert len(result) == STEPS

    context = request.get_span_context()
    trace_id, request_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    [client_span] = exporter.get_finished_spans()  # the client's own span, ended, in the trace
    assert client_span.context.trace_id == context.trace_id
    # The start waited at the server for a worker: the POST that invoked one carried it on.
    assert any(line.split("-")[1:3] == [trace_id, request_id] for line in _rows_text(spans))

    rows = [row for row in _rows(spans) if row["attributes"].get("fusee.workflow.id") == "traced-1"]
    workflows = [row for row in rows if row["name"] == "fusee.workflow"]
    steps = [row for row in rows if row["name"] == "fusee.step"]
    assert {row["trace"] for row in rows} == {trace_id}
    assert {row["parent"] for row in workflows} == {request_id}
    # Attempts ran in the killed process and in the one after it. Those the killed one ended
    # before the kill were exported; the workflow span of the invocation it was killed in
    # never ended, so theirs is the one parent not among the rows.
    assert {killed.popen.pid, fresh.popen.pid} <= {row["pid"] for row in steps}
    exported = {row["span"] for row in workflows}
    assert {row["pid"] for row in steps if row["parent"] not in exported} <= {killed.popen.pid}
    # Budgets ended with the run still going: a workflow span per invocation that held it.
    statuses = [row["attributes"]["fusee.workflow.status"] for row in workflows]
    assert statuses.count("ok") == 1 and statuses.count("running") >= 1, statuses
    # Every step has an attempt that succeeded, in some process, each under the trace.
    succeeded = {row["attributes"]["fusee.step.name"] for row in steps if row["status"] == "UNSET"}
    assert succeeded == {f"s{i}" for i in range(STEPS)}
    await client.close()
    provider.shutdown()


def _rows_text(spans: Path) -> list[str]:
    headers = spans.with_name(spans.name + ".headers")
    return [line for line in headers.read_text().splitlines() if line != "-"] if headers.exists() else []
