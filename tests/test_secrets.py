"""`fusee/_secrets.py`, the one loader of secret files: at least 16 bytes once stripped,
a warning (once per file) when the group or other users can read one, and a `repr` that
never shows a byte of it. Then each place a secret enters, checked to go through it: the
server's tokens and invocation secrets, a worker's `token-file=`, the handler's
settings."""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import socket
from pathlib import Path

import msgspec
import pytest
from fusee_server import endpoints, main, security

import fusee
import handlers
from fusee import _secrets
from fusee._errors import SettingError
from fusee.invoke import invocation_handler
from fusee.protocol import messages as m
from fusee.protocol.address import parse
from fusee.protocol.connection import connect
from tests.invoke import flows
from tests.server_mode import certs

VALUE = "a-secret-of-forty-bytes-0123456789abcdef"


def secret_file(dir: Path, name: str = "secret", mode: int = 0o600, value: str = VALUE) -> str:
    path = dir / name
    path.write_text(f"  {value}\n")
    path.chmod(mode)
    return str(path)


def warnings_about(caplog: pytest.LogCaptureFixture, path: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and path in r.getMessage()]


def server_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    main.add_arguments(parser)
    return parser.parse_args(["--dir", "unused", *argv])


# -- the loader -------------------------------------------------------------------------


def test_a_secret_file_is_read_stripped_and_works_as_bytes(tmp_path):
    secret = _secrets.load(secret_file(tmp_path), "--token-file")
    assert secret == VALUE.encode() and isinstance(secret, bytes)
    assert hmac.new(secret, b"x", "sha256").digest() == hmac.new(VALUE.encode(), b"x", "sha256").digest()


def test_a_secret_never_prints(tmp_path):
    path = secret_file(tmp_path)
    secret = _secrets.load(path, "--token-file")

    class Holder(msgspec.Struct):
        secret: bytes

    shown = [
        repr(secret),
        str(secret),
        f"{secret}",
        "%s %r" % (secret, secret),  # noqa: UP031 (what a logging call does)
        repr([secret]),
        repr(Holder(secret)),
    ]
    for text in shown:
        assert VALUE not in text and VALUE[:8] not in text, text
        assert f"--token-file {path}" in text and "40 bytes" in text, text
    with pytest.raises(TypeError):
        msgspec.json.encode(Holder(secret))  # never serialized by accident either


@pytest.mark.parametrize(
    ("value", "says"), [("fifteen-bytes!!", "15 bytes, at least 16"), ("   ", "0 bytes")]
)
def test_a_short_secret_is_refused_naming_the_setting_and_file(tmp_path, value, says):
    path = secret_file(tmp_path, value=value)
    with pytest.raises(_secrets.SecretError, match=f"--token-file {path}: {says}"):
        _secrets.load(path, "--token-file")
    with pytest.raises(fusee.RejectedError, match="secret=: 15 bytes, at least 16"):
        _secrets.given("fifteen-bytes!!", "secret=")


def test_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(_secrets.SecretError, match=r"--token-file .*missing: No such file"):
        _secrets.load(tmp_path / "missing", "--token-file")


def test_a_file_others_can_read_is_warned_about_once(tmp_path, caplog):
    private = secret_file(tmp_path, "private")
    shared = secret_file(tmp_path, "shared", mode=0o640)
    with caplog.at_level(logging.WARNING, "fusee.secrets"):
        _secrets.load(private, "--token-file")
        for _ in range(3):
            _secrets.load(shared, "--token-file")
    assert not warnings_about(caplog, private)
    [line] = warnings_about(caplog, shared)
    assert "can be read by other users" in line and "640" in line and "chmod 600" in line


def test_a_readable_file_another_user_owns_is_not_warned_about(tmp_path, caplog):
    """A Lambda package's files, a Kubernetes Secret's in a non-root container: owned by
    root, readable by all, and not this process's to chmod."""
    theirs = secret_file(tmp_path, "theirs", mode=0o644)
    try:
        os.chown(theirs, 65534, 65534)  # nobody's
    except PermissionError:
        pytest.skip("needs root to give a file to another user")
    with caplog.at_level(logging.WARNING, "fusee.secrets"):
        _secrets.load(theirs, "FUSEE_INVOKE_SECRET_FILE")
    assert not warnings_about(caplog, theirs)


# -- every place a secret enters --------------------------------------------------------


def test_the_server_reads_its_tokens_and_invocation_secrets_through_the_loader(tmp_path, caplog):
    worker = secret_file(tmp_path, "worker", mode=0o644)
    reader = secret_file(tmp_path, "reader", mode=0o644, value=VALUE[::-1])
    invoke = secret_file(tmp_path, "invoke", mode=0o644)
    with caplog.at_level(logging.WARNING):
        tokens = security.load_tokens(server_args("--token-file", worker, "--read-token-file", reader))
        [endpoint] = endpoints.from_args(
            server_args("--invoke", "http://127.0.0.1:9/", "--invoke-secret-file", invoke)
        )
    for path in (worker, reader, invoke):
        assert warnings_about(caplog, path), path
    assert endpoint.secret == VALUE.encode() and VALUE not in repr(endpoint)
    assert tokens.worker == VALUE.encode() and VALUE not in repr(tokens.scoped)
    short = secret_file(tmp_path, "short", value="short")
    with pytest.raises(SettingError, match=r"--invoke-secret-file .*: 5 bytes, at least 16"):
        endpoints.from_args(server_args("--invoke", "http://127.0.0.1:9/", "--invoke-secret-file", short))
    with pytest.raises(SettingError, match=r"--client-token-file .*: 5 bytes, at least 16"):
        security.load_tokens(server_args("--token-file", worker, "--client-token-file", short))


async def test_a_worker_or_client_reads_its_token_file_through_the_loader(tmp_path, caplog):
    token = secret_file(tmp_path, "token", mode=0o604)
    with socket.socket() as closed:  # a port nobody listens on: the file is read first
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with caplog.at_level(logging.WARNING), pytest.raises(fusee.ConnectionError):
        await connect(parse(f"127.0.0.1:{port}?token-file={token}"), m.Open(m.VERSION, m.ROLE_CLIENT), None)  # type: ignore[arg-type]
    assert warnings_about(caplog, token)
    short = secret_file(tmp_path, "short", value="short")
    with pytest.raises(fusee.RejectedError, match=r"token-file= .*: 5 bytes, at least 16"):
        await connect(parse(f"127.0.0.1:{port}?token-file={short}"), m.Open(m.VERSION, m.ROLE_CLIENT), None)  # type: ignore[arg-type]


def test_the_handler_holds_its_secrets_unprintable(tmp_path, caplog):
    handler = invocation_handler("127.0.0.1:7600", workflows=[flows.greet], secret=[VALUE, VALUE[::-1]])
    assert handler.secrets == [VALUE.encode(), VALUE[::-1].encode()]
    assert VALUE not in repr(handler.secrets) and VALUE[::-1] not in repr(handler.secrets)
    path = secret_file(tmp_path, mode=0o644)
    environment = {"FUSEE_URL": "127.0.0.1:7600", "FUSEE_WORKFLOWS": "tests.invoke.flows"}
    with caplog.at_level(logging.WARNING):
        from_file = handlers.from_environment({**environment, "FUSEE_INVOKE_SECRET_FILE": path})
    assert warnings_about(caplog, path)
    assert VALUE not in repr(from_file.secrets)


async def test_tls_private_keys_others_can_read_are_warned_about(tmp_path, caplog):
    """`ssl` reads the keys itself; the permission check is the loader's all the same."""
    made = certs.make(tmp_path / "certs")
    Path(made.client.key).chmod(0o644)
    copy = tmp_path / "worker-key.pem"
    copy.write_bytes(Path(made.client.key).read_bytes())
    copy.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        endpoints.from_args(
            server_args(
                "--invoke",
                "https://127.0.0.1:9/",
                "--invoke-cert",
                made.client.cert,
                "--invoke-key",
                made.client.key,
            )
        )
        address = parse(f"127.0.0.1:9?ca={made.ca}&cert={made.client.cert}&key={copy}")
        with pytest.raises(fusee.ConnectionError):
            await connect(address, m.Open(m.VERSION, m.ROLE_CLIENT), None)  # type: ignore[arg-type]
    [line] = warnings_about(caplog, made.client.key)
    assert "--invoke-key" in line
    [line] = warnings_about(caplog, str(copy))
    assert "key=" in line
