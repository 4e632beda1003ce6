"""AWS Lambda for the direct-invoke tests, faked at its edge: moto's server (every AWS API
moto has, on 127.0.0.1) in this process, its Invoke running the function's handler here.

Moto without Docker runs no code, so `LambdaBackend.invoke` is replaced by what the
Lambda service does with a synchronous invoke: find the function (404 as moto answers
it), import its handler (`Handler`, e.g. `handlers.aws_lambda.handler`) with its
environment variables once, as a warm instance keeps it, and call it with the event and a
context that counts down from the function's timeout. What the handler returns is the
payload; an exception becomes a function error (`X-Amz-Function-Error: Unhandled` and
AWS's error payload), as the Python runtime reports it. Each call runs on one of a few
long-lived threads, as a Lambda instance serves one request at a time.

Faults on demand, from the JSON control file named on the command line, read at every
invoke: `{"throttle": N, "fail": N, "hang": N, "retryAfter": "1", "hangS": 3}` answers
the next N invokes with Lambda's throttle (`TooManyRequestsException`, 429, `Retry-After`
when given), then the next N with a function error, then holds the next N for `hangS`
seconds before running the handler (a function slower than the caller waits for),
counting each down in the file.

    python -m tests.invoke.moto_lambda CONTROL_FILE   # prints "moto lambda on 127.0.0.1:PORT"
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from moto.awslambda.models import LambdaBackend, LambdaFunction
from moto.core.exceptions import JsonRESTError
from moto.server import ThreadedMotoServer

INSTANCES = 16  # instances serving invokes at once (more wait, as for reserved concurrency)


class TooManyRequests(JsonRESTError):
    code = 429

    def __init__(self, retry_after: str | None) -> None:
        super().__init__("TooManyRequestsException", "Rate Exceeded.")
        self.retry_after = retry_after

    def get_headers(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        headers = super().get_headers(*args, **kwargs)
        return [*headers, ("Retry-After", self.retry_after)] if self.retry_after else headers


class Control:
    """The fault counts in the control file, taken one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def take(self) -> tuple[str | None, dict[str, Any]]:
        """The fault for this invoke ("throttle", "fail", "hang" or None) and the settings."""
        with self.lock:
            try:
                counts = json.loads(self.path.read_text() or "{}")
            except FileNotFoundError:
                return None, {}
            for fault in ("throttle", "fail", "hang"):
                if counts.get(fault, 0) > 0:
                    counts[fault] -= 1
                    scratch = self.path.with_suffix(".tmp")
                    scratch.write_text(json.dumps(counts))
                    scratch.replace(self.path)
                    return fault, counts
            return None, counts


class Context:
    """The Python runtime's context object, as far as handlers read it."""

    def __init__(self, fn: LambdaFunction) -> None:
        self.deadline = time.monotonic() + int(fn.timeout)
        self.function_name = fn.function_name
        self.function_version = fn.version
        self.invoked_function_arn = fn.function_arn
        self.memory_limit_in_mb = str(fn.memory_size)
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


class Runtime:
    def __init__(self, control: Control) -> None:
        self.control = control
        self.handlers: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.instances = ThreadPoolExecutor(INSTANCES, thread_name_prefix="lambda-instance")

    def handler(self, fn: LambdaFunction) -> Any:
        """The function's handler, loaded once (its module reads the environment then)."""
        with self.lock:
            if fn.handler not in self.handlers:
                os.environ.update(fn.environment_vars)
                module, _, name = fn.handler.rpartition(".")
                self.handlers[fn.handler] = getattr(importlib.import_module(module), name)
            return self.handlers[fn.handler]

    def invoke(self, fn: LambdaFunction, body: str, response_headers: dict[str, str]) -> bytes:
        fault, settings = self.control.take()
        if fault == "throttle":
            raise TooManyRequests(settings.get("retryAfter"))
        if fault == "hang":
            time.sleep(settings.get("hangS", 3))
        try:
            if fault == "fail":
                raise RuntimeError("a fault the test asked for")
            event = json.loads(body or "{}")
            result = self.instances.submit(self.handler(fn), event, Context(fn)).result()
            return json.dumps(result).encode()
        except Exception as error:  # noqa: BLE001  the runtime reports it, as Lambda's does
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps(
                {
                    "errorMessage": str(error),
                    "errorType": type(error).__name__,
                    "requestId": str(uuid.uuid4()),
                    "stackTrace": traceback.format_tb(error.__traceback__),
                }
            ).encode()


def main() -> None:
    runtime = Runtime(Control(Path(sys.argv[1])))

    def invoke(
        self: LambdaBackend,
        function_name: str,
        qualifier: str | None,
        body: Any,
        headers: Any,
        response_headers: Any,
    ) -> bytes:
        fn = self.get_function(function_name, qualifier)  # ResourceNotFoundException, 404
        payload = runtime.invoke(fn, body, response_headers)
        response_headers["Content-Length"] = str(len(payload))
        return payload

    LambdaBackend.invoke = invoke  # type: ignore[method-assign,assignment]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"moto lambda on {host}:{port}", flush=True)
    threading.Event().wait()  # until the test stops the process


if __name__ == "__main__":
    main()
