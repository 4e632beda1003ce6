"""What the handler's tests run against, all on loopback:

- `Listener`: a plain TCP listener that counts the connections it accepts (and closes
  each at once), so a test proves that a refused request made none;
- `Uvicorn`: `uvicorn handlers.asgi:app` as its own process, configured by environment;
- `RuntimeApi` and `LambdaRuntime`: the Lambda Runtime API (the edge we fake: AWS's
  side of it) and the real runtime interface client (`python -m awslambdaric`) running
  `handlers.aws_lambda.handler` against it;
- `in_thread`: a call on a thread (and event loop) of its own, as a server runs a handler.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.procs import ROOT, Proc

SECRET = "invoke-tests-secret-0123456789abcdef"

BODY = json.dumps(
    {
        "version": 1,
        "invocation": "8f3c0e5a1b2d4c6e",
        "shards": [2, 5],
        "budgetMs": 60000,
        "reasons": ["call"],
    },
    separators=(",", ":"),
).encode()
"""A valid invocation's body."""

REGION = "us-east-1"
FUNCTION = "fusee-worker"
# Fake credentials for moto: none of the developer's real ones reach it, or AWS.
AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}

Post = Callable[[dict[str, str], bytes], tuple[int, Any]]


@dataclass
class Entry:
    """One way into the handler (tests/invoke/conftest.py's `entry`): `post(headers, body)`
    is its (status, decoded JSON body)."""

    name: str
    post: Post


class Listener:
    """Accepts and counts connections on a fixed loopback port; `stop` leaves nothing
    listening there (a connection is refused) until `start`."""

    def __init__(self) -> None:
        self.port = 0
        self.peers: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.running = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        sock.settimeout(0.05)
        self.port = sock.getsockname()[1]
        self.sock, self.running = sock, True
        self.thread = threading.Thread(target=self._accept, args=(sock,), daemon=True)
        self.thread.start()

    def _accept(self, sock: socket.socket) -> None:
        while self.running:
            try:
                conn, peer = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.peers.append(peer)
            conn.close()

    def stop(self) -> None:
        self.running = False
        if self.thread is not None:
            self.thread.join(5)
        if self.sock is not None:
            self.sock.close()
        self.sock = self.thread = None

    def mark(self) -> int:
        """The count now (see `settled`), to compare with after a request."""
        return self.settled()

    def settled(self) -> int:
        """How many connections were accepted, every earlier one included: a sentinel
        connection is made and waited for (the listener accepts in order)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sentinel:
            mine = sentinel.getsockname()
            deadline = time.monotonic() + 5
            while True:
                with self.lock:
                    if mine in self.peers:
                        index = self.peers.index(mine)
                        del self.peers[index]
                        return index
                if time.monotonic() > deadline:
                    raise AssertionError("the listener never accepted the sentinel connection")
                time.sleep(0.002)


class Uvicorn(Proc):
    """`uvicorn handlers.asgi:app` (or another `app`) on a port of its choosing, on `loop`
    (pinned: with uvloop installed, uvicorn's default would pick it; test_uvloop.py asks
    for it), started in `cwd`."""

    def __init__(
        self, env: dict[str, str], loop: str = "asyncio", app: str = "handlers.asgi:app", cwd: Path = ROOT
    ) -> None:
        args = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "0"]
        args += ["--loop", loop]
        super().__init__(args, env, inherit=False, cwd=cwd)
        self.port = int(self.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1))

    def request(
        self, method: str, headers: dict[str, str], body: bytes, path: str = "/"
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()


class RuntimeApi:
    """The Lambda Runtime API (2018-06-01) as the runtime interface client uses it: it
    long-polls `invocation/next` for an event, and posts the answer to `…/response` (or
    `…/error`, or `init/error` when the handler cannot even be loaded)."""

    PREFIX = "/2018-06-01/runtime"

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.answers: dict[str, queue.Queue[tuple[str, Any]]] = {}
        self.init_errors: queue.Queue[Any] = queue.Queue()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != f"{api.PREFIX}/invocation/next":
                    self._reply(404, b"{}")
                    return
                request_id, event = api.events.get()
                deadline_ms = int(time.time() * 1000) + 60_000
                self._reply(
                    200,
                    event,
                    {
                        "Lambda-Runtime-Aws-Request-Id": request_id,
                        "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                        "Lambda-Runtime-Invoked-Function-Arn": (
                            "arn:aws:lambda:eu-west-1:123456789012:function:fusee-worker"
                        ),
                        "Lambda-Runtime-Trace-Id": "Root=1-5eb1c2d3-0123456789abcdef01234567;Sampled=0",
                    },
                )

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                payload = json.loads(data) if data else None
                if self.path == f"{api.PREFIX}/init/error":
                    api.init_errors.put(payload)
                else:
                    found = re.fullmatch(rf"{api.PREFIX}/invocation/([^/]+)/(response|error)", self.path)
                    if found is None:
                        self._reply(404, b"{}")
                        return
                    api.answers.setdefault(found.group(1), queue.Queue()).put((found.group(2), payload))
                self._reply(202, b'{"status":"OK"}')

            def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def invoke(self, event: dict[str, Any], timeout: float = 30.0) -> tuple[str, Any]:
        """Hand `event` to the function; its answer: ("response", value) or ("error", …)."""
        request_id = str(uuid.uuid4())
        self.answers[request_id] = queue.Queue()
        self.events.put((request_id, json.dumps(event).encode()))
        return self.answers[request_id].get(timeout=timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LambdaRuntime(Proc):
    """`python -m awslambdaric handlers.aws_lambda.handler`, as a Lambda container runs it."""

    def __init__(self, api: RuntimeApi, env: dict[str, str]) -> None:
        env = {
            **env,
            "AWS_LAMBDA_RUNTIME_API": api.address,
            "AWS_LAMBDA_FUNCTION_NAME": "fusee-worker",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_REGION": "eu-west-1",
            "LAMBDA_TASK_ROOT": str(ROOT),
        }
        super().__init__(
            [sys.executable, "-m", "awslambdaric", "handlers.aws_lambda.handler"], env, inherit=False
        )


def in_thread(call: Callable[[], Any]) -> Any:
    """Run `call` on a thread of its own (its own event loop, closed after), as a server or
    the Lambda runtime would: the test's thread keeps no loop of the handler's."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001  re-raised on the test's thread
            error.append(exc)
        finally:
            try:
                loop = asyncio.get_event_loop()
            except RuntimeError:
                return
            loop.close()
            asyncio.set_event_loop(None)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if error:
        raise error[0]
    return result[0]


def published_vector() -> dict[str, str]:
    """The test vector's lines in docs/invoke.md (`name  value`, in its `vector` block)."""
    text = (ROOT / "docs" / "invoke.md").read_text()
    block = re.search(r"```text vector\n(.*?)```", text, re.S)
    assert block, "docs/invoke.md has no ```text vector block"
    fields: dict[str, str] = {}
    for line in block.group(1).splitlines():
        name, _, value = line.partition(" ")
        fields[name] = value.strip()
    return fields
