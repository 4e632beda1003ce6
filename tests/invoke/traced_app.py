"""`uvicorn tests.invoke.traced_app:app`: handlers/asgi.py with telemetry on
(FUSEE_TELEMETRY=otel), under a global tracer provider whose spans are written, each as it
ends, to the JSON-lines file FUSEE_TEST_SPANS; the `traceparent` header of each request
it is sent goes to FUSEE_TEST_SPANS + ".headers". A SIGKILL loses only the spans that had
not ended: what a real exporter would lose."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from handlers import from_environment

SPANS = os.environ["FUSEE_TEST_SPANS"]


class FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(SPANS, "a") as file:
            for span in spans:
                row = {
                    "name": span.name,
                    "trace": f"{span.context.trace_id:032x}",
                    "span": f"{span.context.span_id:016x}",
                    "parent": f"{span.parent.span_id:016x}" if span.parent is not None else None,
                    "attributes": dict(span.attributes or {}),
                    "status": span.status.status_code.name,
                    "pid": os.getpid(),
                }
                file.write(json.dumps(row) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
trace.set_tracer_provider(provider)

handler = from_environment()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        headers = dict(scope.get("headers") or [])
        with open(SPANS + ".headers", "a") as file:
            file.write(headers.get(b"traceparent", b"-").decode() + "\n")
    await handler(scope, receive, send)
