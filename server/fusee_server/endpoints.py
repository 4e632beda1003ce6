"""Invocation endpoints as `fusee server` is told of them: `--invoke URL` (or
`--invoke lambda:FUNCTION[:QUALIFIER]`, see lambda_client.py) starts one and
the `--invoke-*` options after it apply to it, or `--invoke-config FILE` holds them as
JSON (docs/server.md, *Invoking workers*). A wrong setting stops the start, naming
it; unknown keys in the file are refused, so a misspelt one never goes unnoticed."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from fusee import _secrets
from fusee._errors import SettingError
from fusee_server import lambda_client

logger = logging.getLogger("fusee.invoker")

CONCURRENCY = 16
BUDGET_MS = 60_000
GRACE_MS = 30_000
BUDGET_MS_MAX = 15 * 60_000  # the longest platform limit we know of (AWS Lambda's)


class EndpointSettings(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """One endpoint as `--invoke-config` gives it. It has no field for a secret: a secret
    is read from `secretFile` only, where its length is checked, so an inline one is an
    unknown key, refused."""

    url: str
    secret_file: str | None = None
    types: list[str] | None = None  # None: every workflow type
    # The ranges are declared here only: an option's value and a file's key are both
    # checked against them as they are converted (`_convert`, `_read_file`).
    concurrency: Annotated[int, Meta(ge=1, le=10_000)] = CONCURRENCY
    budget_ms: Annotated[int, Meta(ge=1000, le=BUDGET_MS_MAX)] = BUDGET_MS
    shards: Annotated[int, Meta(ge=0, le=1 << 16)] = 0  # the most shards one invocation carries (0: no limit)
    grace_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = GRACE_MS
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    region: str | None = None  # a lambda: endpoint's (resolved at start when not given)

    def takes(self, type: str) -> bool:
        return self.types is None or type in self.types


class Endpoint(EndpointSettings, kw_only=True):
    """An endpoint as the invoker uses it: its settings and the secret its file held."""

    secret: bytes = b""  # read from secret_file at start (a Secret: its repr shows no byte of it)


class EndpointsFile(msgspec.Struct, forbid_unknown_fields=True):
    endpoints: list[EndpointSettings]


class InvokeAction(argparse.Action):
    """`--invoke URL` starts an endpoint; `--invoke-X` sets X on the last one started."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option: str | None = None,
    ) -> None:
        endpoints: list[dict[str, Any]] = getattr(namespace, "endpoints", None) or []
        if self.dest == "url":
            endpoints.append({"url": values, "given": option})
        elif not endpoints:
            parser.error(f"{option} applies to the --invoke URL before it: give --invoke first")
        else:
            if self.dest in endpoints[-1]:
                parser.error(f"{option} given twice for --invoke {endpoints[-1]['url']}")
            endpoints[-1][self.dest] = values
        namespace.endpoints = endpoints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("invoked workers")
    group.add_argument(
        "--invoke",
        dest="url",
        metavar="URL",
        action=InvokeAction,
        help="an endpoint to POST invocations to, or lambda:FUNCTION[:QUALIFIER] to call the Lambda Invoke API",
    )
    options = {
        "secret_file": ("PATH", "its HMAC secret (sign every request)"),
        "types": ("A,B", "the workflow types it runs (default: every type)"),
        "concurrency": ("N", f"invocations at once (default {CONCURRENCY})"),
        "budget_ms": ("MS", f"an invocation's time budget (default {BUDGET_MS})"),
        "shards": ("N", "the most shards one invocation carries (default: no limit)"),
        "ca": ("PEM", "the CA that signs the endpoint's certificate (https)"),
        "cert": ("PEM", "a client certificate to present (mutual TLS)"),
        "key": ("PEM", "its key"),
        "region": ("REGION", "a lambda: endpoint's AWS region (default: its ARN's, else AWS_REGION)"),
    }
    for name, (metavar, text) in options.items():
        flag = "--invoke-" + name.replace("_", "-")
        group.add_argument(flag, dest=name, metavar=metavar, action=InvokeAction, help=text)
    group.add_argument("--invoke-config", metavar="FILE", help='{"endpoints": [{"url": ..., ...}]} (JSON)')
    parser.set_defaults(endpoints=[])


def _fields() -> tuple[dict[str, str], dict[str, tuple[str, int, int]]]:
    """EndpointSettings' keys by attribute, and its whole numbers' ranges by key, as its
    declaration gives them."""
    info = msgspec.inspect.type_info(EndpointSettings)
    assert isinstance(info, msgspec.inspect.StructType)
    keys = {field.name: field.encode_name for field in info.fields}
    ranges = {
        field.encode_name: (field.name, field.type.ge, field.type.le)
        for field in info.fields
        if isinstance(field.type, msgspec.inspect.IntType)
        and field.type.ge is not None
        and field.type.le is not None
    }
    return keys, ranges


_KEYS, _RANGES = _fields()
_AT = re.compile(r" - at `\$(?:\.endpoints\[(\d+)\])?\.(\w+)`$")


def _number_error(
    error: msgspec.ValidationError,
    given: Callable[[int | None], Mapping[str, Any]],
    label: Callable[[int | None, str], str],
) -> SettingError | None:
    """A whole-number setting out of its range (or not a number) said as the option or
    key that gave it: `LABEL VALUE: expected LOW to HIGH`. None for any other error.
    `given(i)`: the settings of the endpoint the error is at (the i-th of a file)."""
    found = _AT.search(str(error))
    if found is None or found.group(2) not in _RANGES:
        return None
    index = int(found.group(1)) if found.group(1) is not None else None
    name, low, high = _RANGES[found.group(2)]
    value = given(index).get(found.group(2))
    if type(value) is int or (isinstance(value, str) and re.fullmatch(r"-?\d+", value)):
        return SettingError(f"{label(index, name)} {int(value)}: expected {low} to {high}")
    return SettingError(f"{label(index, name)} {value!r}: expected a whole number")


def _convert(given: dict[str, Any]) -> Endpoint:
    """An endpoint from its `--invoke` options (strings), checked against its declaration."""
    fields = {_KEYS[name]: value for name, value in given.items()}
    try:
        return msgspec.convert(fields, Endpoint, strict=False)
    except msgspec.ValidationError as error:
        raise _number_error(
            error, lambda _: fields, lambda _, name: "--invoke-" + name.replace("_", "-")
        ) or SettingError(f"--invoke {given['url']}: {error}") from None


def from_args(args: argparse.Namespace) -> list[Endpoint]:
    """The endpoints the options and the config file name, checked, secrets read."""
    found: list[tuple[Endpoint, str]] = []
    for given in args.endpoints:
        fields = {k: v for k, v in given.items() if k != "given"}
        if "types" in fields:
            fields["types"] = [t for t in fields["types"].split(",") if t]
        found.append((_convert(fields), f"--invoke {fields['url']}"))
    if args.invoke_config is not None:
        where = f"--invoke-config {args.invoke_config}"
        listed = _read_file(args.invoke_config)
        if not listed:
            raise SettingError(
                f'{where}: "endpoints" is empty: list at least one endpoint, or leave --invoke-config out '
                "(a server without endpoints invokes nothing)"
            )
        for i, settings in enumerate(listed):
            endpoint = Endpoint(**msgspec.structs.asdict(settings))
            found.append((endpoint, f"{where}: endpoints[{i}] ({settings.url})"))
    for endpoint, where in found:
        check(endpoint, where)
    return [endpoint for endpoint, _ in found]


def _read_file(path: str) -> list[EndpointSettings]:
    where = f"--invoke-config {path}"
    try:
        data = Path(path).read_bytes()
        return msgspec.json.decode(data, type=EndpointsFile).endpoints
    except OSError as error:
        raise SettingError(f"{where}: {error.strerror or error}") from None
    except msgspec.ValidationError as error:

        def given(i: int | None) -> Mapping[str, Any]:
            # Only for an error at endpoints[i]: the file is an object with that list.
            return msgspec.json.decode(data)["endpoints"][i] if i is not None else {}

        def label(i: int | None, name: str) -> str:
            return f"{where}: endpoints[{i}] ({given(i).get('url')}): {name}"

        number_error = _number_error(error, given, label)
        if number_error is not None:
            raise number_error from None
        if "unknown field `secret`" in str(error):
            # A secret written into the config file would skip the checks its file gets
            # (16 bytes at least), and sits in a file made to be shared and reviewed.
            raise SettingError(
                f'{where}: an inline "secret" is not accepted ({error}): put the secret in a file of '
                'its own (at least 16 bytes; chmod 600) and name it with "secretFile"'
            ) from None
        raise SettingError(f"{where}: {error}") from None
    except msgspec.DecodeError as error:
        raise SettingError(f"{where}: not JSON: {error}") from None


def check(endpoint: Endpoint, where: str | None = None) -> None:
    """The endpoint can work: a URL the invoker can POST to (or a Lambda target), TLS
    files that go together, a secret file that is long enough. `where`
    names the option that gave it."""
    where = where or f"--invoke {endpoint.url}"
    if lambda_client.is_lambda(endpoint.url):
        _check_lambda(endpoint, where)
    else:
        _check_url(endpoint.url, where)
        if endpoint.region is not None:
            raise SettingError(f"{where}: --invoke-region is for lambda: endpoints")
    if (endpoint.cert is None) != (endpoint.key is None):
        raise SettingError(f"{where}: --invoke-cert and --invoke-key go together")
    if endpoint.key is not None:
        _secrets.check_private(endpoint.key, f"{where}: --invoke-key")
    if (endpoint.ca or endpoint.cert) and urlsplit(endpoint.url).scheme != "https":
        raise SettingError(f"{where}: --invoke-ca/--invoke-cert need an https:// URL")
    if endpoint.secret_file is not None:
        try:
            endpoint.secret = _secrets.load(endpoint.secret_file, "--invoke-secret-file")
        except _secrets.SecretError as error:
            raise SettingError(f"{where}: {error}") from None
    elif lambda_client.is_lambda(endpoint.url):
        logger.warning(
            "%s has no --invoke-secret-file: its invocations are unsigned, so whoever IAM lets "
            "invoke the function can make it run one",
            where,
        )
    else:
        logger.warning(
            "%s has no --invoke-secret-file: its requests are unsigned, so the endpoint must check "
            "this server's client certificate instead",
            where,
        )


_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _check_url(url: str, where: str) -> None:
    """A URL every invocation would fail on (no host, a port out of range, a space) stops
    the start here rather than costing a failed POST, a backoff and a log line each."""
    expected = "expected an http:// or https:// URL, or lambda:FUNCTION[:QUALIFIER]"
    if any(c.isspace() or not c.isprintable() for c in url):
        raise SettingError(f"{where}: a URL has no spaces or control characters ({expected})")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingError(f"{where}: {expected}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise SettingError(f"{where}: the port is not one from 1 to 65535")
    host = parts.hostname
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise SettingError(f"{where}: {host!r} is not a host name") from None
    labels = ascii_host.removesuffix(".").split(".")
    if len(ascii_host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise SettingError(f"{where}: {host!r} is not a host name (letters, digits, - and . only)")


def _check_lambda(endpoint: Endpoint, where: str) -> None:
    """The function parses and a region is known, now: a wrong one fails the start, not
    every invocation. boto3 is imported here, only when such an endpoint is configured."""
    try:
        target = lambda_client.parse(endpoint.url)
        endpoint.region = lambda_client.region(endpoint.region, target)
    except ValueError as error:
        raise SettingError(f"{where}: {error}") from None
