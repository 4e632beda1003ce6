"""Invocation endpoints as `fusee server` is told of them: `--invoke URL` (or
`--invoke lambda:FUNCTION[:QUALIFIER]`, see lambda_invoke.py) starts one and
the `--invoke-*` options after it apply to it, or `--invoke-config FILE` holds them as
JSON (spec: Invoked workers, *Configuration*). A wrong setting stops the start, naming
it; unknown keys in the file are refused, so a misspelt one never goes unnoticed."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from fusee_server import lambda_invoke

logger = logging.getLogger("fusee.invoker")

CONCURRENCY = 16
BUDGET_MS = 60_000
GRACE_MS = 30_000
BUDGET_MS_MAX = 15 * 60_000  # the longest platform limit we know of (AWS Lambda's)


class Endpoint(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    url: str
    secret_file: str | None = None
    types: list[str] | None = None  # None: every workflow type
    concurrency: int = CONCURRENCY
    budget_ms: int = BUDGET_MS
    shards: int = 0  # the most shards one invocation carries (0: no limit)
    grace_ms: int = GRACE_MS
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    region: str | None = None  # a lambda: endpoint's (resolved at start when not given)
    secret: bytes = b""  # read from secret_file at start

    def takes(self, type: str) -> bool:
        return self.types is None or type in self.types


class EndpointsFile(msgspec.Struct, forbid_unknown_fields=True):
    endpoints: list[Endpoint]


class ConfigError(Exception):
    """A wrong setting: the message names it."""


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


def _int(value: Any, option: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{option} {value!r}: expected a whole number") from None
    if not low <= number <= high:
        raise ConfigError(f"{option} {number}: expected {low} to {high}")
    return number


def endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """The endpoints the options and the config file name, checked, secrets read."""
    found: list[Endpoint] = []
    for given in args.endpoints:
        fields = {k: v for k, v in given.items() if k != "given"}
        if "types" in fields:
            fields["types"] = [t for t in fields["types"].split(",") if t]
        for name, low, high in (
            ("concurrency", 1, 10_000),
            ("budget_ms", 1000, BUDGET_MS_MAX),
            ("shards", 0, 1 << 16),
        ):
            if name in fields:
                fields[name] = _int(fields[name], "--invoke-" + name.replace("_", "-"), low, high)
        found.append(Endpoint(**fields))
    if args.invoke_config is not None:
        try:
            data = Path(args.invoke_config).read_bytes()
            found += msgspec.json.decode(data, type=EndpointsFile).endpoints
        except OSError as error:
            raise ConfigError(f"--invoke-config {args.invoke_config}: {error.strerror or error}") from None
        except msgspec.ValidationError as error:
            raise ConfigError(f"--invoke-config {args.invoke_config}: {error}") from None
        except msgspec.DecodeError as error:
            raise ConfigError(f"--invoke-config {args.invoke_config}: not JSON: {error}") from None
    for endpoint in found:
        check(endpoint)
    return found


def check(endpoint: Endpoint) -> None:
    where = f"--invoke {endpoint.url}"
    parts = urlsplit(endpoint.url)
    if lambda_invoke.is_lambda(endpoint.url):
        _check_lambda(endpoint, where)
    elif parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: expected an http:// or https:// URL, or lambda:FUNCTION[:QUALIFIER]")
    elif endpoint.region is not None:
        raise ConfigError(f"{where}: --invoke-region is for lambda: endpoints")
    for name, low, high in (
        ("concurrency", 1, 10_000),
        ("budget_ms", 1000, BUDGET_MS_MAX),
        ("shards", 0, 1 << 16),
        ("grace_ms", 0, 3_600_000),
    ):
        _int(getattr(endpoint, name), f"{where}: {name}", low, high)
    if (endpoint.cert is None) != (endpoint.key is None):
        raise ConfigError(f"{where}: --invoke-cert and --invoke-key go together")
    if (endpoint.ca or endpoint.cert) and parts.scheme != "https":
        raise ConfigError(f"{where}: --invoke-ca/--invoke-cert need an https:// URL")
    if endpoint.secret_file is not None:
        try:
            endpoint.secret = Path(endpoint.secret_file).read_bytes().strip()
        except OSError as error:
            raise ConfigError(
                f"{where}: --invoke-secret-file {endpoint.secret_file}: {error.strerror or error}"
            ) from None
        if len(endpoint.secret) < 16:
            raise ConfigError(
                f"{where}: --invoke-secret-file {endpoint.secret_file}: at least 16 bytes (use 32 random bytes)"
            )
    elif lambda_invoke.is_lambda(endpoint.url):
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


def _check_lambda(endpoint: Endpoint, where: str) -> None:
    """The function parses and a region is known, now: a wrong one fails the start, not
    every invocation. boto3 is imported here, only when such an endpoint is configured."""
    try:
        target = lambda_invoke.parse(endpoint.url)
        endpoint.region = lambda_invoke.region(endpoint.region, target)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
