"""The server image's Dockerfile: its CMD run as the container runs it (this checkout's
`fusee` in place of the image's), its HEALTHCHECK run against that server, its stop on
SIGTERM; and what its stages, ignore file and final stage promise one another.

Only what cannot exist here is replaced: the image's paths (the data volume, the
mounted token) by temporary ones, and the ports by free ones, since a fixed port may be
taken by another test run on this machine. Hosts and every other argument stay as
written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.examples.dockerfile import ignore_rules, included, logical_lines
from tests.support.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HEALTHCHECK_SCRIPT = ROOT / "deploy" / "docker" / "fusee-healthcheck"
IMAGE_PATH = "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # python:3.11-slim's


@dataclass
class Stage:
    base: str
    name: str | None
    lines: list[tuple[str, str]] = field(default_factory=list)  # (instruction, the rest)

    def all(self, keyword: str) -> list[str]:
        return [rest for key, rest in self.lines if key == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, f"{keyword}: {len(found)} in the stage FROM {self.base}"
        return found[0]


def stages() -> list[Stage]:
    found: list[Stage] = []
    for _, line in logical_lines(DOCKERFILE.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            found.append(Stage(base.strip(), name.strip() or None))
        else:
            found[-1].lines.append((keyword, rest))
    return found


def final() -> Stage:
    return stages()[-1]


def cmd() -> list[str]:
    rest = final().one("CMD")
    assert rest.startswith("["), "CMD in exec form: the server is PID 1 and gets SIGTERM"
    argv: list[str] = json.loads(rest)
    return argv


def healthcheck() -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options and its command (exec form)."""
    words = final().one("HEALTHCHECK").split(" CMD ", 1)
    options = dict(word.removeprefix("--").split("=", 1) for word in shlex.split(words[0]))
    argv: list[str] = json.loads(words[1])
    return options, argv


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2].split("/")[0])


def test_two_stages_the_wheels_built_in_one_and_installed_in_the_other() -> None:
    build, runtime = stages()
    assert build.name == "build" and runtime.name is None
    # The native module is linked against the build stage's glibc: the same Debian.
    assert build.base.endswith("-bookworm") and runtime.base.endswith("-bookworm")
    assert runtime.base.startswith("python:3.11")  # the oldest Python fusee supports
    (wheel,) = [run for run in build.all("RUN") if " wheel " in run]
    assert "./server" in wheel and " . " in wheel  # fusee-server (maturin) and fusee
    assert "COPY --from=build /wheels /wheels" in [f"COPY {c}" for c in runtime.all("COPY")]


def test_the_build_context_holds_what_the_copy_lines_copy_and_nothing_else() -> None:
    rules = ignore_rules(ROOT / "Dockerfile.dockerignore")
    for stage in stages():
        for copy in stage.all("COPY"):
            words = [w for w in shlex.split(copy) if not w.startswith("--")]
            if copy.startswith("--from="):
                continue
            for source in words[:-1]:
                assert (ROOT / source).exists() and included(source, rules), source
    kept = ["pyproject.toml", "README.md", "fusee/__init__.py", "server/Cargo.toml", "server/Cargo.lock"]
    kept += ["server/src/lib.rs", "server/fusee_server/server.py", "deploy/docker/fusee-healthcheck"]
    assert [path for path in kept if not included(path, rules)] == []
    left_out = [".venv/bin/python", "server/target/release/libfusee_disk.so", "tests/conftest.py"]
    left_out += ["fusee/__pycache__/__init__.cpython-311.pyc", "server/fusee_server/_native.abi3.so"]
    left_out += [".git/HEAD", ".cache/deploy-tools/bin/helm", "handlers/asgi.py", "server/tests/scrub.rs"]
    assert [path for path in left_out if included(path, rules)] == []


def test_the_final_stage_runs_unprivileged_with_its_data_on_the_volume() -> None:
    stage, argv = final(), cmd()
    uid, _, gid = stage.one("USER").partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()  # numeric: runAsNonRoot checks it
    assert stage.one("VOLUME") == option(argv, "--dir") == "/var/lib/fusee"
    exposed = {int(port) for port in stage.one("EXPOSE").split()}
    assert exposed == {port_of(option(argv, "--listen")), port_of(option(argv, "--http"))} == {7600, 7601}
    # The health check is on the image's PATH, where the COPY puts it.
    (copied,) = [c for c in stage.all("COPY") if "fusee-healthcheck" in c]
    assert shlex.split(copied)[-1] == "/usr/local/bin/fusee-healthcheck"
    options, check = healthcheck()
    assert check[0] == "fusee-healthcheck"
    assert port_of(check[1]) == port_of(option(argv, "--http")) and check[1].endswith("/healthz")
    assert check[2] == option(argv, "--token-file")  # the server's own token file
    assert {"interval", "timeout", "start-period", "retries"} <= set(options)


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in final().all("ENV"):
        for word in shlex.split(rest):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def run_healthcheck(argv: list[str], url: str, token_file: Path) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command with the test's URL and token file: the script runs
    under this Python, as the image's python3 runs it."""
    assert argv[0] == "fusee-healthcheck"
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), url, str(token_file)],
        capture_output=True,
        text=True,
        timeout=15,
    )


def test_the_cmd_serves_healthz_to_the_healthcheck_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    argv = cmd()
    assert argv[:2] == ["fusee", "server"]
    data, token = tmp_path / "var-lib-fusee", tmp_path / "token"
    token.write_text(os.urandom(32).hex() + "\n")
    token.chmod(0o600)
    listen, http = free_port(), free_port()
    replaced = {
        "--dir": str(data),
        "--token-file": str(token),
        "--listen": f"{option(argv, '--listen').rpartition(':')[0]}:{listen}",
        "--http": f"{option(argv, '--http').rpartition(':')[0]}:{http}",
    }
    # Every option is one of these: a new one in the CMD must be looked at here.
    assert set(a for a in argv if a.startswith("--")) == set(replaced)
    args = [replaced.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    # The container's environment: the image's PATH (this venv's bin standing for
    # /usr/local/bin, where pip puts `fusee`), its ENV, and nothing of this process's.
    venv_bin = str(Path(sys.executable).parent)
    env = {"PATH": IMAGE_PATH.replace("/usr/local/bin", venv_bin), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    server = Proc(args, {**env, **image_env()}, inherit=False, cwd=tmp_path)
    try:
        server.wait_for(r"ready")
        _, check = healthcheck()
        url = check[1].replace(f":{port_of(check[1])}/", f":{http}/")
        passed = run_healthcheck(check, url, token)
        assert passed.returncode == 0, passed.stderr + server.output()

        # /healthz wants the token, which is why the check reads the token file.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        refused.value.close()
        assert refused.value.code == 401
        bearer = {"Authorization": f"Bearer {token.read_text().strip()}"}
        with urllib.request.urlopen(urllib.request.Request(url, headers=bearer), timeout=5) as answer:
            assert json.load(answer)["status"] == "serving"
        (tmp_path / "wrong").write_text("w" * 32)
        assert run_healthcheck(check, url, tmp_path / "wrong").returncode == 1
    finally:
        code = server.stop()  # SIGTERM, as `docker stop` sends
    assert code == 0, server.output()
    assert (data / "fusee.meta").exists() or any(data.iterdir())  # the volume got the data
    assert run_healthcheck(check, url, token).returncode == 1  # nothing answers any more
