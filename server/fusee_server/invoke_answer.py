"""What an endpoint answered an invocation, whichever way it was sent (an HTTP POST or the
Lambda Invoke API), and what a failed answer means in words a user can act on: the text
the invocation metrics' `lastError` and a call that waited in vain both give
(docs/server.md, *Failures*)."""

from __future__ import annotations

import json
from typing import NamedTuple

DETAIL_CHARS = 200  # of an answer's body, kept to say why it failed


class Answer(NamedTuple):
    status: int  # 0: no answer (no connection, a broken response)
    retry_after: str | None = None  # the Retry-After header, as given
    detail: str = ""  # the start of the body, or what went wrong sending it
    location: str | None = None  # a redirect's Location (never followed)
    meaning: str | None = None  # what the status means here, when it is not what MEANINGS says


# What the handler (fusee/invoke/_entry_points.py) or the platform in front of it means by each
# status, said as what to check.
MEANINGS = {
    400: "the handler could not read the request (is it a fusee handler of this version?)",
    401: "the handler refused the signature: check that its secret (FUSEE_INVOKE_SECRET) is the "
    "server's --invoke-secret-file",
    403: "the platform refused the request: check the function URL's or the service's authorization",
    404: "nothing at this URL: check the endpoint's URL and path",
    405: "the URL does not take a POST: check the endpoint's URL and path",
    413: "the request was too large for the endpoint",
    500: "the handler failed (its log has the traceback)",
    502: "the handler could not reach the server: check its FUSEE_URL, token file and CA "
    "(or the function failed)",
    504: "the platform gave up waiting for the handler",
}


def describe(answer: Answer) -> str:
    """`401: the handler refused the signature: ...`, with the answer's own words after."""
    status = answer.status
    if status == 0:
        return f"no answer: {answer.detail or 'the connection failed'}"
    if 300 <= status < 400:
        where = f" to {answer.location}" if answer.location else ""
        return (
            f"{status}: a redirect{where}, not followed (a signed request goes to the configured "
            "URL only): give the endpoint's final URL"
        )
    meaning = answer.meaning or MEANINGS.get(
        status, "the handler answered an error" if status >= 400 else "an unexpected status"
    )
    said = _said(answer.detail)
    return f"{status}: {meaning}" + (f" ({said})" if said else "")


def _said(detail: str) -> str:
    """The handler's `{"error": ...}`, or the start of whatever else the body held."""
    text = detail.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        text = value["error"]
    text = " ".join(text.split())
    return text[:DETAIL_CHARS] + ("…" if len(text) > DETAIL_CHARS else "")
