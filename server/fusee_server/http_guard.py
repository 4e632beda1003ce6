"""Who may ask the HTTP site what, checked before any route runs (docs/http-api.md,
*Who may ask*): the bearer token's scope, and what keeps a web page in a browser from
using the API behind its user's back.

- A token is configured: no bearer (or a wrong one) is 401; a read token's change is 403,
  as is a namespace token's `/metrics` (its runs' calls are checked by access.py).
- `--identity-header NAME` (behind a proxy that signs people in): the header names the
  person, kept as `by` in what the request records. Without a token configured, a
  request without the header is 401; with one, the bearer is still required.
- A loopback site with no token answers only requests for this machine's names
  (`localhost`, `127.0.0.1`, `[::1]`, with the port it serves): a page whose own name
  resolves to 127.0.0.1 (DNS rebinding) sends its own name as the Host, and is refused.
- A browser's `Origin` must be this site: a page elsewhere cannot send a request a
  browser marks as its own.
- The web UI (fusee_server/ui) signs a browser in once: its sign-in page keeps the token
  in a `fusee-token` cookie (SameSite=Strict), taken here as a bearer when a request has
  no Authorization header. The cookie makes no cross-site change possible: the rules
  below (a same-site Origin, JSON or `X-Fusee-Action`) hold for it as for a header.
  The UI's static files (/static/: its script, style and htmx) need no token.
- A change (any method but GET and HEAD) carries a JSON body (`Content-Type:
  application/json`) or `X-Fusee-Action: 1`. An HTML form can send neither, and a
  script on another site cannot either without a CORS preflight, which this site never
  grants: so a page elsewhere cannot make a change even against an open loopback API.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

import msgspec
from aiohttp import web

from fusee._errors import DOCS, Failure
from fusee_server.access import Grant, Scope, Tokens
from fusee_server.http_types import Error

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

READS = frozenset({"GET", "HEAD"})
IDENTITY_CHARS_MAX = 256
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
ACTION_HEADER = "X-Fusee-Action"
TOKEN_COOKIE = "fusee-token"  # set by the web UI's sign-in page (ui/static/ui.js)
PUBLIC = "/static/"  # the web UI's script, style and htmx: nothing secret, no token

_encode = msgspec.json.Encoder().encode


def error_response(
    status: int,
    code: str,
    message: str,
    cause: Failure | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error as JSON: its code, message, docs section and recorded cause."""
    body = Error(code, message, DOCS + code.lower(), cause)
    return web.Response(body=_encode(body), status=status, content_type="application/json", headers=headers)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _public(path: str) -> bool:
    """One of the web UI's static files (never a path that climbs out of them)."""
    return path.startswith(PUBLIC) and ".." not in path and "//" not in path


class Guard:
    """The site's middleware. `local_port` is set by the start when the site serves only
    loopback addresses and the server has no token: the Host check applies then."""

    def __init__(self, tokens: Tokens, tls: bool, identity_header: str | None = None) -> None:
        self.tokens = tokens  # replaced whole by a reload (SIGHUP): a request sees one set
        self.scheme = "https" if tls else "http"
        self.local_port: int | None = None
        # The web UI's sign-in page, answered instead of the JSON 401 to a browser
        # asking for a page (set by `WebUi.add_to`).
        self.sign_in: Callable[[web.Request], web.Response] | None = None
        self.identity_header = identity_header

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except web.HTTPException as error:  # no such route, method, or a body too large
            if error.status < 400:
                raise
            code = "NotFound" if error.status == 404 else "Rejected"
            return error_response(error.status, code, f"{request.method} {request.path}: {error.reason}")

    def _refusal(self, request: web.Request) -> web.Response | None:
        host = request.headers.get("Host", "")
        if self.local_port is not None and not self._local(host):
            return error_response(
                403,
                "Rejected",
                f"this API listens on loopback without a token and answers only requests for "
                f"localhost, 127.0.0.1 or [::1] on port {self.local_port}, not for Host {host!r} "
                "(a page that points its own name at this machine is refused)",
            )
        grant: Grant | None = None
        tokens = self.tokens
        if self.identity_header is not None:
            who = request.headers.get(self.identity_header)
            if who is None and tokens.worker is None:
                return error_response(
                    401,
                    "Rejected",
                    f"this API is reached through a proxy that signs people in: the header "
                    f"{self.identity_header} names who asks, and this request has none",
                )
            if who is not None and not (0 < len(who) <= IDENTITY_CHARS_MAX and who.isprintable()):
                return error_response(
                    400, "Rejected", f"{self.identity_header}: 1 to {IDENTITY_CHARS_MAX} printable characters"
                )
        if tokens.worker is not None and not _public(request.path):
            grant = self._bearer(tokens, self._authorization(request))
            if grant is None:
                if self.sign_in is not None and self._wants_page(request):
                    return self.sign_in(request)
                return error_response(
                    401,
                    "Rejected",
                    "a bearer token is required (Authorization: Bearer <the server's --token-file, "
                    "--client-token-file, --read-token-file token or a --namespaces-file one>)",
                    headers={"WWW-Authenticate": 'Bearer realm="fusee"'},
                )
        origin = request.headers.get("Origin")
        if origin is not None and origin.lower() != f"{self.scheme}://{host}".lower():
            return error_response(
                403, "Rejected", f"Origin {origin!r} is not this site ({self.scheme}://{host})"
            )
        if grant is not None and grant.scope is Scope.NAMESPACE and not request.path.startswith("/v1/"):
            return error_response(
                403,
                "Rejected",
                f"{request.path}: a namespace's token reaches the /v1 runs only (a full token)",
            )
        if request.method in READS:
            return None
        if grant is not None and grant.scope is Scope.READ:
            return error_response(403, "Rejected", "a read token may only read (GET)")
        content_type = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if content_type != "application/json" and request.headers.get(ACTION_HEADER) != "1":
            return error_response(
                400,
                "Rejected",
                f"a {request.method} changes something: send a JSON body (Content-Type: application/json) "
                f"or the header {ACTION_HEADER}: 1",
            )
        return None

    def grant_of(self, request: web.Request) -> Grant | None:
        """The grant of the request's token (None: the server has no token), once the
        middleware let it through (a handler asks: every call it makes is checked)."""
        if self.tokens.worker is None:
            return None
        return self._bearer(self.tokens, self._authorization(request))

    def scope_of(self, request: web.Request) -> Scope | None:
        """The scope alone (the UI's pages ask what to offer)."""
        grant = self.grant_of(request)
        return grant.scope if grant is not None else None

    def requester(self, request: web.Request, grant: Grant | None) -> str:
        """Who asked, as audited records keep it (`by`): the person the proxy signed in
        (only with --identity-header), else the token's kind, else `http`."""
        if self.identity_header is not None:
            who = request.headers.get(self.identity_header)
            if who is not None:
                return who
        return grant.by if grant is not None else "http"

    @staticmethod
    def _authorization(request: web.Request) -> str:
        """The Authorization header, or else the web UI's cookie as a bearer."""
        header = request.headers.get("Authorization")
        if header is not None:
            return header
        cookie = request.cookies.get(TOKEN_COOKIE)
        return f"Bearer {unquote(cookie)}" if cookie else ""

    @staticmethod
    def _wants_page(request: web.Request) -> bool:
        """A browser asking for one of the web UI's pages (not an API call)."""
        return (
            request.method == "GET"
            and not request.path.startswith(("/v1/", "/metrics", "/healthz"))
            and "text/html" in request.headers.get("Accept", "")
        )

    def _local(self, host: str) -> bool:
        """`host` names this machine, on the port served (or, without a port, the
        scheme's default one, if that is the port served)."""
        name, colon, port = host.rpartition(":")
        if not colon or name.endswith(":") or (name.startswith("[") != name.endswith("]")):
            name, port = host, ""  # no port ([::1] alone has colons, but no ':' after ']')
        if name.lower() not in LOCAL_NAMES:
            return False
        default = 443 if self.scheme == "https" else 80
        return port == str(self.local_port) or (port == "" and self.local_port == default)

    @staticmethod
    def _bearer(tokens: Tokens, header: str) -> Grant | None:
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        try:
            offered = given.strip().encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None
        # Constant time: how long a refusal takes says nothing about how much matched.
        return tokens.bearer(offered)
