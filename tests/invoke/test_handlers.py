"""`handlers/`: the entry points deployed as they are, configured by environment. A missing
or bad setting fails the import with a message naming it: in a process of its own (as
uvicorn or Lambda imports it), and under the real Lambda runtime as an init error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fusee
import handlers
from fusee.invoke import InvocationHandler, invocation_handler
from tests.invoke import flows
from tests.server_mode import certs
from tests.support.handlers import SECRET, LambdaRuntime, RuntimeApi, Uvicorn
from tests.support.procs import ROOT, environment

GOOD = {"FUSEE_URL": "127.0.0.1:7600", "FUSEE_INVOKE_SECRET": SECRET, "FUSEE_WORKFLOWS": "tests.invoke.flows"}


def without(name: str) -> dict[str, str]:
    return {k: v for k, v in GOOD.items() if k != name}


def test_the_environment_makes_the_handler(tmp_path: Path) -> None:
    handler = handlers.from_environment(GOOD)
    assert isinstance(handler, InvocationHandler)
    assert handler.workflows == [v for v in vars(flows).values() if isinstance(v, fusee.Workflow)]
    assert flows.greet in handler.workflows
    assert handler.secrets == [SECRET.encode()]
    assert (handler.address.host, handler.address.port) == ("127.0.0.1", 7600)
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"  {SECRET}\n")  # as `openssl rand -hex 32 > file` leaves it
    from_file = handlers.from_environment(
        {**without("FUSEE_INVOKE_SECRET"), "FUSEE_INVOKE_SECRET_FILE": str(secret_file)}
    )
    assert from_file.secrets == [SECRET.encode()]
    assert (handler.bodies.timeout_s, handler.bodies.waits_max) == (10.0, 16)
    limits = {"FUSEE_INVOKE_BODY_TIMEOUT_S": " 2.5 ", "FUSEE_INVOKE_BODY_WAITS_MAX": "4"}
    limited = handlers.from_environment({**GOOD, **limits})
    assert (limited.bodies.timeout_s, limited.bodies.waits_max) == (2.5, 4)
    several = handlers.from_environment(
        {**GOOD, "FUSEE_WORKFLOWS": " tests.invoke.flows , tests.server_mode.flows"}
    )
    assert flows.greet in several.workflows and len(several.workflows) > 1
    assert "telemetry" not in handler.engine_options  # off unless asked for
    traced = handlers.from_environment({**GOOD, "FUSEE_TELEMETRY": " OTel "})
    assert type(traced.engine_options["telemetry"]).__name__ == "Telemetry"
    assert "telemetry" not in handlers.from_environment({**GOOD, "FUSEE_TELEMETRY": "off"}).engine_options


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (without("FUSEE_URL"), "FUSEE_URL is not set"),
        ({**GOOD, "FUSEE_URL": "  "}, "FUSEE_URL is not set"),
        ({**GOOD, "FUSEE_URL": "nowhere"}, "FUSEE_URL: address 'nowhere'"),
        ({**GOOD, "FUSEE_URL": "127.0.0.1:7600?tls=1"}, "FUSEE_URL: .*unknown option 'tls'"),
        ({**GOOD, "FUSEE_URL": "127.0.0.1:7600?invocation=a"}, "FUSEE_URL: leave invocation= out"),
        (without("FUSEE_INVOKE_SECRET"), r"FUSEE_INVOKE_SECRET \(or FUSEE_INVOKE_SECRET_FILE\) is not set"),
        ({**GOOD, "FUSEE_INVOKE_SECRET": "short"}, "FUSEE_INVOKE_SECRET: 5 bytes, at least 16"),
        (
            {**GOOD, "FUSEE_INVOKE_SECRET_FILE": "/x"},
            "FUSEE_INVOKE_SECRET and FUSEE_INVOKE_SECRET_FILE are both set",
        ),
        (
            {**without("FUSEE_INVOKE_SECRET"), "FUSEE_INVOKE_SECRET_FILE": "/nonexistent/secret"},
            "FUSEE_INVOKE_SECRET_FILE /nonexistent/secret: No such file",
        ),
        (without("FUSEE_WORKFLOWS"), "FUSEE_WORKFLOWS is not set"),
        ({**GOOD, "FUSEE_WORKFLOWS": " , "}, "FUSEE_WORKFLOWS is not set"),
        (
            {**GOOD, "FUSEE_WORKFLOWS": "tests.invoke.nonexistent"},
            "FUSEE_WORKFLOWS: cannot import 'tests.invoke.nonexistent'",
        ),
        ({**GOOD, "FUSEE_WORKFLOWS": "json"}, "FUSEE_WORKFLOWS: module 'json' defines no workflow"),
        (
            {**GOOD, "FUSEE_INVOKE_BODY_TIMEOUT_S": "0"},
            "FUSEE_INVOKE_BODY_TIMEOUT_S=0: expected a number of seconds above 0",
        ),
        ({**GOOD, "FUSEE_INVOKE_BODY_TIMEOUT_S": "nan"}, "FUSEE_INVOKE_BODY_TIMEOUT_S=nan: expected"),
        (
            {**GOOD, "FUSEE_INVOKE_BODY_WAITS_MAX": "1.5"},
            "FUSEE_INVOKE_BODY_WAITS_MAX=1.5: expected a whole number from 1",
        ),
        ({**GOOD, "FUSEE_TELEMETRY": "zipkin"}, "FUSEE_TELEMETRY=zipkin: expected otel or off"),
    ],
)
def test_a_missing_or_bad_setting_is_named(settings: dict[str, str], message: str) -> None:
    with pytest.raises(handlers.SettingError, match=message):
        handlers.from_environment(settings)


def test_a_secret_file_too_short_is_named(tmp_path: Path) -> None:
    short = tmp_path / "secret"
    short.write_text("abc\n")
    with pytest.raises(
        handlers.SettingError, match=r"FUSEE_INVOKE_SECRET_FILE .*secret: 3 bytes, at least 16"
    ):
        handlers.from_environment({**without("FUSEE_INVOKE_SECRET"), "FUSEE_INVOKE_SECRET_FILE": str(short)})


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Good TLS files and token, and files that are there but wrong."""
    tmp = tmp_path_factory.mktemp("files")
    made = certs.make(tmp)
    (tmp / "token").write_text("handler-test-token-0123456789abcdef\n")
    (tmp / "short-token").write_text("abc\n")
    (tmp / "not-pem").write_text("not a certificate\n")
    return {
        "ca": made.ca,
        "cert": made.client.cert,
        "key": made.client.key,
        "token": str(tmp / "token"),
        "short-token": str(tmp / "short-token"),
        "not-pem": str(tmp / "not-pem"),
    }


def url_with(files: dict[str, str], options: str) -> str:
    return "127.0.0.1:7600?" + options.format(**files)


def test_the_files_the_address_names_are_read_at_start(files: dict[str, str]) -> None:
    good = url_with(files, "ca={ca}&cert={cert}&key={key}&token-file={token}")
    handler = handlers.from_environment({**GOOD, "FUSEE_URL": good})
    assert handler.address.token_file == files["token"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("token-file=/nonexistent/token", "FUSEE_URL: token-file=/nonexistent/token: No such file"),
        ("token-file={short-token}", "FUSEE_URL: token-file= .*short-token: 3 bytes, at least 16"),
        ("ca=/nonexistent/ca.pem", "FUSEE_URL: ca=/nonexistent/ca.pem: No such file"),
        ("ca={not-pem}", r"FUSEE_URL: ca=.*not-pem: not a CA certificate file \(PEM\)"),
        ("ca={ca}&cert=/nonexistent/c.pem&key={key}", "FUSEE_URL: cert=/nonexistent/c.pem: No such file"),
        ("ca={ca}&cert={cert}&key=/nonexistent/k.pem", "FUSEE_URL: key=/nonexistent/k.pem: No such file"),
        ("ca={ca}&cert={cert}&key={ca}", "FUSEE_URL: cert=.*, key=.*: not a certificate and its key"),
    ],
)
def test_a_missing_or_bad_file_of_the_address_is_named(
    files: dict[str, str], options: str, message: str
) -> None:
    with pytest.raises(handlers.SettingError, match=message):
        handlers.from_environment({**GOOD, "FUSEE_URL": url_with(files, options)})


def test_the_handler_itself_reads_the_files_as_it_is_made() -> None:
    with pytest.raises(fusee.RejectedError, match="token-file=/nonexistent/token: No such file"):
        invocation_handler(
            "127.0.0.1:7600?token-file=/nonexistent/token", workflows=[flows.greet], secret=SECRET
        )


def import_in_a_process(module: str, **settings: str) -> subprocess.CompletedProcess[str]:
    code = f"import {module} as m; print(type(getattr(m, 'app', None) or m.handler).__name__)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environment(**settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("module", ["handlers.asgi", "handlers.aws_lambda"])
def test_each_entry_point_imports_with_its_environment(module: str) -> None:
    done = import_in_a_process(module, **GOOD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("InvocationHandler" if module == "handlers.asgi" else "method")


@pytest.mark.parametrize("module", ["handlers.asgi", "handlers.aws_lambda"])
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (without("FUSEE_URL"), "handlers.SettingError: FUSEE_URL is not set"),
        (
            without("FUSEE_INVOKE_SECRET"),
            "handlers.SettingError: FUSEE_INVOKE_SECRET (or FUSEE_INVOKE_SECRET_FILE)",
        ),
        (
            {**GOOD, "FUSEE_WORKFLOWS": "no_such_module"},
            "handlers.SettingError: FUSEE_WORKFLOWS: cannot import",
        ),
        (
            {**GOOD, "FUSEE_URL": "127.0.0.1:7600?token-file=/nonexistent/token"},
            "handlers.SettingError: FUSEE_URL: token-file=/nonexistent/token: No such file",
        ),
        (
            {**GOOD, "FUSEE_URL": "127.0.0.1:7600?ca=/nonexistent/ca.pem"},
            "handlers.SettingError: FUSEE_URL: ca=/nonexistent/ca.pem: No such file",
        ),
        (
            {**without("FUSEE_INVOKE_SECRET"), "FUSEE_INVOKE_SECRET_FILE": "/nonexistent/secret"},
            "handlers.SettingError: FUSEE_INVOKE_SECRET_FILE /nonexistent/secret: No such file",
        ),
    ],
)
def test_a_bad_setting_fails_the_import(module: str, settings: dict[str, str], message: str) -> None:
    done = import_in_a_process(module, **settings)
    assert done.returncode == 1
    assert message in done.stderr.splitlines()[-1]


def test_under_the_lambda_runtime_a_bad_setting_is_an_init_error() -> None:
    api = RuntimeApi()
    runtime = LambdaRuntime(api, environment(**without("FUSEE_URL")))
    try:
        error = api.init_errors.get(timeout=30)
        assert runtime.popen.wait(30) == 1
    finally:
        runtime.stop()
        api.close()
    assert error["errorType"] == "SettingError"
    assert error["errorMessage"].startswith("FUSEE_URL is not set")


def test_uvicorn_serves_the_trace_on_its_standard_error(uvicorn_app: Uvicorn) -> None:
    status, headers, body = uvicorn_app.request("POST", {}, b"{}")
    assert (status, body) == (401, b'{"error":"unauthorized"}')
    assert headers["content-type"] == "application/json"
    uvicorn_app.wait_for(r"^fusee invoke - \+[\d.]+ms refused status=401 why='no fusee-signature header'$")
    status, headers, _ = uvicorn_app.request("GET", {}, b"")
    assert (status, headers["allow"]) == (405, "POST")


def test_a_keys_file_makes_the_engines_encrypt(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# newest first\nk2 {'ab' * 32}\nk1 {'cd' * 32}\n")
    handler = handlers.from_environment({**GOOD, "FUSEE_CODEC_KEYS_FILE": str(keys)})
    assert handler.engine_options["codec"].key_ids == ["k2", "k1"]
    assert "codec" not in handlers.from_environment(GOOD).engine_options
    for text, message in [
        ("k1 abcd\n", "32 bytes"),
        ("k1\n", "expected '<key ID> <64 hex digits>'"),
        ("# nothing\n", "no keys in it"),
    ]:
        keys.write_text(text)
        with pytest.raises(handlers.SettingError, match=f"FUSEE_CODEC_KEYS_FILE.*{message}"):
            handlers.from_environment({**GOOD, "FUSEE_CODEC_KEYS_FILE": str(keys)})
    with pytest.raises(handlers.SettingError, match=r"FUSEE_CODEC_KEYS_FILE=.*No such file"):
        handlers.from_environment({**GOOD, "FUSEE_CODEC_KEYS_FILE": str(tmp_path / "gone")})
