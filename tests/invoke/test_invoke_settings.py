"""`fusee server`'s invoker settings that can never work stop the start, naming the option:
an inline secret in `--invoke-config`, an empty endpoint list, an endpoint URL no request
could reach; and no option is taken for an abbreviation of another."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fusee._errors import SettingError
from tests.support.procs import ROOT, free_port
from tests.support.server_cli import endpoints, start_fails

SECRET = "settings-test-secret-0123456789abcdef"


def config(tmp_path: Path, *listed: dict[str, object]) -> str:
    path = tmp_path / "invoke.json"
    path.write_text(json.dumps({"endpoints": list(listed)}))
    return str(path)


@pytest.mark.parametrize("secret", ["a", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"], ids=["1 byte", "32 bytes"])
def test_an_inline_secret_in_the_config_file_is_refused(tmp_path: Path, secret: str) -> None:
    """Short or long: a secret is read from `secretFile` only (its length checked there)."""
    path = config(tmp_path, {"url": "http://127.0.0.1:9/", "secret": secret})
    with pytest.raises(SettingError) as raised:
        endpoints("--invoke-config", path)
    message = str(raised.value)
    assert message.startswith(f'--invoke-config {path}: an inline "secret" is not accepted'), message
    assert '"secretFile"' in message
    output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", "--invoke-config", path)
    assert 'an inline "secret" is not accepted' in output, output


def test_a_secret_file_holds_at_least_16_bytes(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("x\n")
    path = config(tmp_path, {"url": "http://127.0.0.1:9/", "secretFile": str(short)})
    with pytest.raises(SettingError, match="1 bytes, at least 16"):
        endpoints("--invoke-config", path)


def test_the_secret_is_never_printed(tmp_path: Path) -> None:
    file = tmp_path / "secret"
    file.write_text(SECRET)
    (found,) = endpoints("--invoke", "http://127.0.0.1:9/", "--invoke-secret-file", str(file))
    assert bytes(found.secret) == SECRET.encode()
    assert SECRET not in repr(found) and SECRET not in str(found)


def test_an_empty_endpoint_list_is_refused(tmp_path: Path) -> None:
    path = config(tmp_path)
    with pytest.raises(SettingError, match=r'"endpoints" is empty: list at least one endpoint'):
        endpoints("--invoke-config", path)
    output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", "--invoke-config", path)
    assert f'--invoke-config {path}: "endpoints" is empty' in output, output


NEVER_WORK = {
    "http://127.0.0.1:99999/": "the port is not one from 1 to 65535",
    "http://127.0.0.1:0/": "the port is not one from 1 to 65535",
    "http://127.0.0.1:-1/": "the port is not one from 1 to 65535",
    "http://exa mple.com/": "a URL has no spaces or control characters",
    "http://example.com/ path": "a URL has no spaces or control characters",
    "http://example.com/\n": "a URL has no spaces or control characters",
    "http://a..b/": "'a..b' is not a host name",
    "http://-a.example/": "'-a.example' is not a host name",
    "http://a_b!.example/": "'a_b!.example' is not a host name",
    "http:///path": "expected an http:// or https:// URL",
    "ftp://example.com/": "expected an http:// or https:// URL",
}


@pytest.mark.parametrize(("url", "why"), NEVER_WORK.items(), ids=NEVER_WORK.keys())
def test_an_endpoint_url_that_can_never_work_stops_the_start_naming_it(
    tmp_path: Path, url: str, why: str
) -> None:
    with pytest.raises(SettingError) as raised:
        endpoints("--invoke", url)
    assert str(raised.value).startswith(f"--invoke {url}: {why}"), raised.value
    path = config(tmp_path, {"url": "http://127.0.0.1:9/"}, {"url": url})
    with pytest.raises(SettingError) as raised:
        endpoints("--invoke-config", path)
    assert str(raised.value).startswith(f"--invoke-config {path}: endpoints[1] ({url}): {why}"), raised.value


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "https://[::1]:8443/invoke",
        "https://fusee-worker.example.com/invoke?x=1",
        "http://worker_1:8080/",
        "https://bücher.example/",
        "http://localhost/",
    ],
)
def test_endpoint_urls_that_can_work_are_taken(url: str) -> None:
    assert endpoints("--invoke", url)[0].url == url


def test_a_port_out_of_range_stops_a_real_start(tmp_path: Path) -> None:
    output = start_fails(
        tmp_path / "server", "--listen", "127.0.0.1:0", "--invoke", "http://127.0.0.1:99999/"
    )
    assert "--invoke http://127.0.0.1:99999/: the port is not one from 1 to 65535" in output, output


# -- abbreviations ------------------------------------------------------------------------


def test_an_abbreviated_option_is_not_taken_for_the_full_one(tmp_path: Path) -> None:
    """`--invoke-secret FILE` is no option: it is refused, not read as `--invoke-secret-file`
    (which would sign with the file's contents)."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    url = f"http://127.0.0.1:{free_port()}/"
    output = start_fails(
        tmp_path / "server", "--listen", "127.0.0.1:0", "--invoke", url, "--invoke-secret", str(secret)
    )
    assert "unrecognized arguments: --invoke-secret" in output, output


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", ".", "--js"],
        ["disk-check", ".", "--js"],
        ["invocations", "127.0.0.1:9", "--js"],
        ["runs", "ls", "127.0.0.1:9", "--js"],
    ],
)
def test_the_fusee_commands_take_no_abbreviation(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "fusee", *argv], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --js" in done.stderr, done.stderr


def _parsers(path: Path) -> list[tuple[int, bool]]:
    """(line, takes no abbreviation) of each parser `path` makes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("ArgumentParser", "add_parser"):
                strict = any(
                    k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in node.keywords
                )
                found.append((node.lineno, strict))
    return found


def test_every_parser_refuses_abbreviations() -> None:
    files = [
        path
        for folder in ("fusee", "server/fusee_server", "handlers", "examples", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if ".venv" not in path.parts
    ]
    loose = [
        f"{path.relative_to(ROOT)}:{line}" for path in files for line, strict in _parsers(path) if not strict
    ]
    assert loose == [], "argparse parsers without allow_abbrev=False: " + ", ".join(loose)
