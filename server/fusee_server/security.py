"""The server's tokens and TLS settings, read from their files at the start and again at
each `SIGHUP` (docs/server.md, *Security*): `Security.reload` builds the whole new set
first, and only if every file loads does it take the place of the old one. New
connections and HTTP requests use the current set; a binary connection keeps the grant
it proved when it was made.

The namespaces file (`--namespaces-file`) holds one namespace and its token per line,
`#` starting a comment:

    # namespace token
    acme    9c1f0e...
    globex  47ab2d...

A namespace's token reaches the runs whose workflow ID starts with `<namespace>/`.
"""

from __future__ import annotations

import argparse
import logging
import re
import ssl
from pathlib import Path

from fusee import _secrets
from fusee._errors import FuseeError, SettingError
from fusee_server.access import Tokens
from fusee_server.listener import server_tls

logger = logging.getLogger("fusee.server")

NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def load_namespaces(path: str) -> dict[str, _secrets.Secret]:
    """Namespace -> its token, from `path`; SettingError naming the file and line."""
    option = "--namespaces-file"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingError(f"{option} {path}: {getattr(error, 'strerror', None) or error}") from None
    _secrets.check_private(path, option)
    found: dict[str, _secrets.Secret] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{option} {path}, line {number}"
        if len(fields) != 2:
            raise SettingError(f"{where}: expected a namespace and its token, separated by spaces")
        namespace, token = fields
        if not NAMESPACE.fullmatch(namespace):
            raise SettingError(
                f"{where}: namespace {namespace!r}: letters, digits, '.', '_', '-' (no '/': the "
                "namespace is what comes before the first '/' of a workflow ID)"
            )
        if namespace in found:
            raise SettingError(f"{where}: namespace {namespace!r} is given twice")
        try:
            found[namespace] = _secrets.given(token, where)
        except FuseeError as error:
            raise SettingError(str(error)) from None
    return found


def load_tokens(args: argparse.Namespace) -> Tokens:
    """The server's tokens, each read by the one secret loader (fusee/_secrets.py). A
    narrower token without the worker token, or two places holding one token, stop the
    start (or a reload): the first would guard nothing, the second would blur the scopes."""
    loaded: dict[str, _secrets.Secret] = {}
    for option, path in (
        ("--token-file", args.token_file),
        ("--client-token-file", args.client_token_file),
        ("--read-token-file", args.read_token_file),
    ):
        if path is None:
            continue
        try:
            token = _secrets.load(path, option)
        except FuseeError as error:
            raise SettingError(str(error)) from None
        if option != "--token-file" and "--token-file" not in loaded:
            raise SettingError(
                f"{option} needs --token-file: without a worker token any peer may hold shards"
            )
        same = [other for other, known in loaded.items() if known == token]
        if same:
            raise SettingError(f"{option} holds the same token as {same[0]}: give each its own")
        loaded[option] = token
    namespaces = load_namespaces(args.namespaces_file) if args.namespaces_file is not None else {}
    if namespaces and "--token-file" not in loaded:
        raise SettingError(
            "--namespaces-file needs --token-file: without a worker token any peer may hold shards"
        )
    for namespace, token in namespaces.items():
        same = [other for other, known in loaded.items() if known == token]
        if same:
            raise SettingError(
                f"--namespaces-file: namespace {namespace!r} holds the same token as {same[0]}: give each its own"
            )
        loaded[f"namespace {namespace!r}"] = token
    return Tokens(
        loaded.get("--token-file"),
        loaded.get("--client-token-file"),
        loaded.get("--read-token-file"),
        namespaces,
    )


def load_tls(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, bytes]:
    """The TLS context and its binding (none without --tls-cert)."""
    if args.tls_cert is None:
        return None, b""
    _secrets.check_private(args.tls_key, "--tls-key")
    try:
        return server_tls(args.tls_cert, args.tls_key, args.tls_ca)
    except (OSError, ValueError) as error:
        raise SettingError(f"--tls-cert/--tls-key/--tls-ca: {error}") from None


class Security:
    """The current tokens, TLS context and binding. The TLS context is the one the
    listeners were made with: a reload loads the new certificate into it (after a fresh
    context proved the files good), so new handshakes present it and old ones keep theirs."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tokens = load_tokens(args)
        self.tls, self.binding = load_tls(args)
        self.watchers: list[object] = []  # each has a `tokens` attribute (the HTTP guard)

    def reload(self) -> bool:
        """Read every file again; on any failure keep the old settings, log why and say False."""
        try:
            tokens = load_tokens(self.args)
            tls, binding = load_tls(self.args)
            if self.tls is not None:
                self.tls.load_cert_chain(self.args.tls_cert, self.args.tls_key)
                if self.args.tls_ca is not None:
                    self.tls.load_verify_locations(self.args.tls_ca)
        except (SettingError, OSError, ssl.SSLError) as error:
            logger.error("SIGHUP: keeping the settings in use, a file did not load: %s", error)
            return False
        self.tokens = tokens
        if tls is not None:
            self.binding = binding
        for watcher in self.watchers:
            watcher.tokens = tokens  # type: ignore[attr-defined]
        logger.info(
            "SIGHUP: reloaded the token files%s for new connections",
            " and the TLS certificate" if tls is not None else "",
        )
        return True
