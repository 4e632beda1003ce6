"""Ready-made entry points to deploy as they are, configured by the environment:

- `uvicorn handlers.asgi:app` (Cloud Run, a container, any host that runs uvicorn);
- `handlers.aws_lambda.handler` (AWS Lambda: invoked directly, function URL, API Gateway, ALB).

| variable | meaning |
| --- | --- |
| `FUSEE_URL` | the server's address with its options (`host:7600?ca=ca.pem&token-file=token`) |
| `FUSEE_INVOKE_SECRET` | the secret the server signs requests with (its `--invoke-secret-file`) |
| `FUSEE_INVOKE_SECRET_FILE` | or a file holding it (surrounding whitespace is not part of it) |
| `FUSEE_WORKFLOWS` | the module(s) to import, comma-separated: every workflow they define is run |
| `FUSEE_INVOKE_TRACE` | `1`: one line per invocation event on standard error |
| `FUSEE_INVOKE_BODY_TIMEOUT_S` | seconds a request's whole body may take to arrive (default 10; 408 after) |
| `FUSEE_INVOKE_BODY_WAITS_MAX` | requests that may wait for their body at once (default 16; the oldest gets 503) |
| `FUSEE_CODEC_KEYS_FILE` | payloads encrypted with AES-256-GCM: lines of `<key ID> <64 hex digits>`, the first encrypting (docs/engine.md, *Payload encryption*) |
| `FUSEE_TELEMETRY` | `otel`: traces through the global OpenTelemetry tracer provider (`pip install 'fusee[otel]'`) |

A missing or bad setting fails the import with a message naming it (SettingError), so a
misconfigured deployment fails its first start instead of answering requests wrongly:
every setting, the files included (the secret file, and the token, CA, certificate and key
files FUSEE_URL names are read then). The package is installed with `fusee`, so these
entry points import from any directory.
"""

from __future__ import annotations

import importlib
import math
import os
from typing import Any

from fusee import FuseeError, ObjectType, Workflow, _secrets
from fusee import _errors as errors
from fusee.invoke import InvocationHandler
from fusee.invoke._body import BODY_TIMEOUT_S, BODY_WAITS_MAX
from fusee.invoke._entry_points import check_files
from fusee.protocol.address import Address
from fusee.protocol.address import parse as parse_address


class SettingError(errors.SettingError):
    """A missing or bad environment setting; the message names it. Fusee's one
    SettingError, named after this package so that a failed import says where to look."""


def from_environment(environ: dict[str, str] | None = None) -> InvocationHandler:
    env = dict(os.environ if environ is None else environ)
    address = _address(env.get("FUSEE_URL", ""))
    secret = _secret(env)
    workflows = import_workflows(env.get("FUSEE_WORKFLOWS", ""))
    timeout_s = _number(env, "FUSEE_INVOKE_BODY_TIMEOUT_S", float, BODY_TIMEOUT_S)
    waits_max = _number(env, "FUSEE_INVOKE_BODY_WAITS_MAX", int, BODY_WAITS_MAX)
    options = _telemetry(env.get("FUSEE_TELEMETRY", ""))
    options.update(_codec(env.get("FUSEE_CODEC_KEYS_FILE", "")))
    return InvocationHandler(
        address,
        workflows=workflows,
        secret=secret,
        body_timeout_s=timeout_s,
        body_waits_max=waits_max,
        **options,
    )


def _codec(path: str) -> dict[str, Any]:
    """`codec=` for the engines: AES-256-GCM with the keys of FUSEE_CODEC_KEYS_FILE (lines
    of `<key ID> <64 hex digits>`, the first encrypting); nothing when unset."""
    if not path:
        return {}
    from fusee._sealing import aes_gcm, keys_file

    try:
        with open(path) as file:
            text = file.read()
        return {"codec": aes_gcm(keys_file(text, path))}
    except OSError as error:
        raise SettingError(f"FUSEE_CODEC_KEYS_FILE={path}: {error.strerror or error}") from None
    except errors.FuseeError as error:
        raise SettingError(f"FUSEE_CODEC_KEYS_FILE: {error.message}") from None


def _telemetry(setting: str) -> dict[str, Any]:
    """`telemetry=` for the engines, through the tracer provider the process installed (an
    `opentelemetry-instrument` wrapper, or the app's own code): nothing when unset."""
    setting = setting.strip().lower()
    if setting in ("", "off"):
        return {}
    if setting != "otel":
        raise SettingError(f"FUSEE_TELEMETRY={setting}: expected otel or off")
    try:
        from fusee.engine.telemetry import open_telemetry
    except ImportError as error:
        raise SettingError(
            f"FUSEE_TELEMETRY=otel needs the OpenTelemetry API: pip install 'fusee[otel]' ({error})"
        ) from None
    return {"telemetry": open_telemetry()}


def _number(env: dict[str, str], name: str, kind: type[float] | type[int], default: float) -> Any:
    setting = env.get(name, "").strip()
    if not setting:
        return default
    try:
        value: float | None = kind(setting)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        what = "a whole number from 1" if kind is int else "a number of seconds above 0"
        raise SettingError(f"{name}={setting}: expected {what}")
    return value


def _address(setting: str) -> Address:
    if not setting.strip():
        raise SettingError(
            "FUSEE_URL is not set: the server's address, e.g. fusee.example.com:7600?ca=ca.pem"
        )
    try:
        address = parse_address(setting.strip())
    except FuseeError as error:
        raise SettingError(f"FUSEE_URL: {error}") from None
    if address.invocation is not None:
        raise SettingError("FUSEE_URL: leave invocation= out (each request sets it)")
    try:
        check_files(address)
    except FuseeError as error:
        raise SettingError(f"FUSEE_URL: {error}") from None
    return address


def _secret(env: dict[str, str]) -> bytes:
    inline = env.get("FUSEE_INVOKE_SECRET", "")
    path = env.get("FUSEE_INVOKE_SECRET_FILE", "")
    if inline and path:
        raise SettingError("FUSEE_INVOKE_SECRET and FUSEE_INVOKE_SECRET_FILE are both set: set one")
    if not path and not inline.strip():
        raise SettingError(
            "FUSEE_INVOKE_SECRET (or FUSEE_INVOKE_SECRET_FILE) is not set: the secret the server "
            "signs invocations with (its --invoke-secret-file)"
        )
    try:
        if path:
            return _secrets.load(path, "FUSEE_INVOKE_SECRET_FILE")
        return _secrets.given(inline, "FUSEE_INVOKE_SECRET")
    except _secrets.SecretError as error:
        raise SettingError(str(error)) from None


def import_workflows(setting: str, name_of_setting: str = "FUSEE_WORKFLOWS") -> list[Any]:
    """The workflows and object types FUSEE_WORKFLOWS' modules define (`setting`:
    comma-separated module names), SettingError naming the module that cannot be imported
    or defines none. examples/lambda/deploy.py calls it before building a zip; `fusee
    replay-check` too, naming its `--module` option instead."""
    names = [name.strip() for name in setting.split(",") if name.strip()]
    if not names:
        raise SettingError(
            f"{name_of_setting} is not set: the module(s) that define the workflows, e.g. app.flows"
        )
    found: dict[str, Any] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # the module's own failure, whatever it is, named here
            raise SettingError(
                f"{name_of_setting}: cannot import {name!r}: {type(error).__name__}: {error}"
            ) from error
        mine = [value for value in vars(module).values() if isinstance(value, (Workflow, ObjectType))]
        if not mine:
            raise SettingError(
                f"{name_of_setting}: module {name!r} defines no workflow (@fusee.workflow) and no object type"
            )
        for wf in mine:
            known = found.setdefault(wf.name, wf)
            if known is not wf and (isinstance(wf, ObjectType) or known.fn is not wf.fn):
                raise SettingError(f"{name_of_setting}: two workflows are named {wf.name!r} (in {name!r})")
    return list(found.values())
