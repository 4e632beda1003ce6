"""A function URL in front of the deployment zip, for tests/examples/test_lambda_deploy.py.

Run as `python -I -S lambda_front.py ZIP_DIR PORT`: an interpreter that sees no
site-packages, no PYTHON* variable and not this file's directory, only the standard
library and the extracted zip, as Lambda's runtime sees /var/task. It imports
`handlers.aws_lambda` from the zip (configured by FUSEE_* in the environment), reports
where everything it loaded came from, then serves HTTP on loopback: each POST becomes the
event a function URL sends (payload format 2.0, "Invoking Lambda function URLs" in AWS's
documentation) and the handler's answer becomes the HTTP response, as a function URL
makes it. Standard library only, like everything this interpreter can import.
"""

import base64
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

zip_dir, port = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, zip_dir)

import handlers.aws_lambda  # noqa: E402  (the zip is on the path only from here)

TIMEOUT_MS = 90_000

loaded = {
    name: getattr(sys.modules[name], "__file__", None)
    for name in ("fusee", "handlers", "orders", "msgspec", "google_crc32c", "mangum")
}
outside = {name: path for name, path in loaded.items() if not str(path).startswith(zip_dir)}
try:
    import fusee_server  # noqa: F401
except ImportError:
    server_importable = False
else:
    server_importable = True


class Context:
    """What the Lambda runtime passes as `context`, as much of it as the handler reads."""

    function_name = "fusee-orders"
    aws_request_id = "00000000-0000-0000-0000-000000000000"

    def __init__(self) -> None:
        self.deadline = time.monotonic() + TIMEOUT_MS / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def function_url_event(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """A POST as a function URL hands it to the function: header names lowercased, the
    body base64 (what Lambda does with a body it does not take for text; the handler
    must read it either way)."""
    domain = "abcdefghijkl.lambda-url.eu-west-1.on.aws"
    http = {"method": "POST", "path": "/", "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"}
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": {**{k.lower(): v for k, v in headers.items()}, "host": domain},
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "abcdefghijkl",
            "domainName": domain,
            "domainPrefix": "abcdefghijkl",
            "http": {**http, "userAgent": headers.get("User-Agent", "")},
            "requestId": "c3e1e2a4-9f8b-4c1d-8f00-000000000001",
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime()),
            "timeEpoch": int(time.time() * 1000),
        },
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


class Front(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        event = function_url_event(dict(self.headers.items()), body)
        answer = handlers.aws_lambda.handler(event, Context())
        data = answer.get("body") or ""
        payload = base64.b64decode(data) if answer.get("isBase64Encoded") else data.encode()
        print(f"front answered {answer['statusCode']}", flush=True)
        self.send_response(int(answer["statusCode"]))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


server = ThreadingHTTPServer(("127.0.0.1", port), Front)
server.daemon_threads = True
report = {"outside": outside, "server_importable": server_importable, "path": sys.path}
print("ready " + json.dumps(report), flush=True)
server.serve_forever()
