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

A missing or bad setting fails the import with a message naming it (SettingError), so a
misconfigured deployment fails its first start instead of answering requests wrongly.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from fusee import FuseeError, Workflow
from fusee.invoke import InvocationHandler
from fusee.protocol.address import Address
from fusee.protocol.address import parse as parse_address


class SettingError(RuntimeError):
    """A missing or bad environment setting; the message names it."""


def from_environment(environ: dict[str, str] | None = None) -> InvocationHandler:
    env = dict(os.environ if environ is None else environ)
    address = _address(env.get("FUSEE_URL", ""))
    secret = _secret(env)
    workflows = _workflows(env.get("FUSEE_WORKFLOWS", ""))
    return InvocationHandler(address, workflows=workflows, secret=secret)


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
    return address


def _secret(env: dict[str, str]) -> bytes:
    inline = env.get("FUSEE_INVOKE_SECRET", "")
    path = env.get("FUSEE_INVOKE_SECRET_FILE", "")
    if inline and path:
        raise SettingError("FUSEE_INVOKE_SECRET and FUSEE_INVOKE_SECRET_FILE are both set: set one")
    if path:
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as error:
            raise SettingError(f"FUSEE_INVOKE_SECRET_FILE={path}: {error.strerror or error}") from None
        name = "FUSEE_INVOKE_SECRET_FILE"
    elif inline:
        secret, name = inline.strip().encode(), "FUSEE_INVOKE_SECRET"
    else:
        raise SettingError(
            "FUSEE_INVOKE_SECRET (or FUSEE_INVOKE_SECRET_FILE) is not set: the secret the server "
            "signs invocations with (its --invoke-secret-file)"
        )
    if len(secret) < 16:
        raise SettingError(f"{name}: {len(secret)} bytes, at least 16 (the server requires as much)")
    return secret


def _workflows(setting: str) -> list[Workflow[Any]]:
    names = [name.strip() for name in setting.split(",") if name.strip()]
    if not names:
        raise SettingError(
            "FUSEE_WORKFLOWS is not set: the module(s) that define the workflows, e.g. app.flows"
        )
    found: dict[str, Workflow[Any]] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # the module's own failure, whatever it is, named here
            raise SettingError(
                f"FUSEE_WORKFLOWS: cannot import {name!r}: {type(error).__name__}: {error}"
            ) from error
        mine = [value for value in vars(module).values() if isinstance(value, Workflow)]
        if not mine:
            raise SettingError(f"FUSEE_WORKFLOWS: module {name!r} defines no workflow (@fusee.workflow)")
        for wf in mine:
            known = found.setdefault(wf.name, wf)
            if known.fn is not wf.fn:
                raise SettingError(f"FUSEE_WORKFLOWS: two workflows are named {wf.name!r} (in {name!r})")
    return list(found.values())
