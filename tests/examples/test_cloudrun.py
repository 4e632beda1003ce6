"""examples/cloudrun: the order app as a Cloud Run service.

The Dockerfile's image is laid out from the repository as its COPY lines say and its
CMD run as the container runs it (tests/examples/dockerfile.py says what is reproduced),
with the environment service.yaml gives it, its secrets read from a stand-in for Secret
Manager and its secret volumes mounted. A real `fusee server`, started with the
`--invoke` options of README.md's server line, invokes it over loopback; a client runs
orders to their results. service.yaml's numbers are checked against that same line."""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fusee_server.endpoints import BUDGET_MS, CONCURRENCY, GRACE_MS

import fusee
from fusee.protocol.address import parse as parse_address
from tests.examples.dockerfile import Container, Image, build, ignore_rules, included, parse
from tests.server_mode import certs
from tests.support.cluster import LEASE_LINES, held_by_nobody, sends
from tests.support.procs import Proc, Server, free_port, retry
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "cloudrun"
DOCKERFILE = HERE / "Dockerfile"


def server_line() -> list[str]:
    """README.md's `fusee server ...` command, its continuation lines joined, split."""
    lines = (HERE / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("fusee server "):
            command = line
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i]
            return shlex.split(command)[2:]
    raise AssertionError("README.md has no `fusee server` line")


def options(args: list[str]) -> dict[str, str]:
    """`--name value` pairs (every option of the server line takes a value)."""
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    found = dict(zip(args[::2], args[1::2], strict=True))
    assert len(found) == len(args) // 2, f"an option given twice: {args}"
    return found


def service() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((HERE / "service.yaml").read_text())
    return loaded


def template(svc: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """The revision template's annotations, its spec, and its one container."""
    spec = svc["spec"]["template"]
    containers = spec["spec"]["containers"]
    assert len(containers) == 1, "one container: the image's"
    return spec["metadata"]["annotations"], spec["spec"], containers[0]


# -- the image ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    return build(DOCKERFILE, ROOT, tmp_path_factory.mktemp("image"))


def test_the_image_holds_the_handler_the_app_and_fusee_and_nothing_else(image: Image) -> None:
    spec = image.spec
    assert re.fullmatch(r"python:3\.1[1-9]-slim", spec.base)
    assert spec.env["FUSEE_WORKFLOWS"] == "orders" and spec.env["PYTHONUNBUFFERED"] == "1"
    assert "FUSEE_URL" not in spec.env and "FUSEE_INVOKE_SECRET" not in spec.env  # the deployment's
    assert spec.user not in (None, "root", "0")
    assert spec.workdir == "/app"
    app = sorted(p.relative_to(image.path("/app")).as_posix() for p in image.path("/app").rglob("*.py"))
    handlers = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "handlers").glob("*.py"))
    assert app == [*handlers, "orders.py"]  # the handler and the app: no other code of the repo
    site = {p.name for p in image.site.iterdir()}
    assert {"fusee", "uvicorn", "msgspec", "google_crc32c", "h11", "click"} <= site
    assert not {"fusee_server", "aiohttp", "mangum", "pytest"} & site  # the function's needs only
    assert not image.path("/src").exists()  # pip's source is removed after the install


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    rules = ignore_rules(HERE / "Dockerfile.dockerignore")
    copied = ["pyproject.toml", "README.md", "fusee/__init__.py", "fusee/invoke/_entry_points.py"]
    copied += ["handlers/asgi.py", "examples/orders/orders.py"]
    assert all(included(path, rules) for path in copied)
    left_out = [".venv/bin/python", "server/fusee_server/server.py", "server/target/release/x.so"]
    left_out += ["tests/examples/test_cloudrun.py", "examples/quickstart.py", ".git/HEAD"]
    left_out += ["fusee/__pycache__/__init__.cpython-311.pyc", "handlers/__pycache__/asgi.cpython-311.pyc"]
    assert not [path for path in left_out if included(path, rules)]


def test_a_dockerfile_instruction_the_reader_does_not_reproduce_fails_the_parse() -> None:
    base = "FROM python:3.11-slim\nCMD exec true\n"
    assert parse(base).cmd == ["/bin/sh", "-c", "exec true"]
    for line in ("ARG X=1", "RUN apt-get install -y curl", "COPY --chown=1 a b", "ENV A=$B"):
        with pytest.raises(ValueError):
            parse(base + line + "\n")


def test_cloud_build_builds_this_dockerfile_from_the_repository_root() -> None:
    config = yaml.safe_load((HERE / "cloudbuild.yaml").read_text())
    (step,) = config["steps"]
    args = step["args"]
    assert args[0] == "build" and args[-1] == "."
    assert (ROOT / args[args.index("-f") + 1]) == DOCKERFILE
    assert args[args.index("-t") + 1] in config["images"]


def test_a_container_without_its_secret_fails_at_start_naming_it(image: Image) -> None:
    env = image.environment(PORT=str(free_port()), FUSEE_URL="127.0.0.1:7600")
    container = Container(image, env)
    try:
        container.wait_for(r"FUSEE_INVOKE_SECRET")
        assert container.popen.wait(10) != 0
    finally:
        container.stop()


# -- the container, invoked --------------------------------------------------------------


class SecretManager:
    """What the deployment's secrets hold, by name; `latest` and a pinned version alike."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values
        self.read: set[str] = set()

    def access(self, name: str) -> bytes:
        self.read.add(name)
        return self.values[name]


def deployed_environment(
    svc: dict[str, Any], image: Image, secrets: SecretManager, server_address: str
) -> dict[str, str]:
    """The container's environment as Cloud Run makes it from service.yaml: PORT, the
    plain values and the secret ones; secret volumes mounted under the image's root. The
    server's address is this test's: FUSEE_URL's host:port is replaced, its options kept,
    their paths under a mount rooted as the image is."""
    _, spec, container = template(svc)
    volumes = {v["name"]: v["secret"] for v in spec.get("volumes", [])}
    mounts = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        for item in volume["items"]:
            file = image.path(mount["mountPath"]) / item["path"]
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(secrets.access(volume["secretName"]))
        mounts[mount["mountPath"]] = str(image.path(mount["mountPath"]))
    env = {"PORT": str(container["ports"][0]["containerPort"])}
    for entry in container["env"]:
        if "valueFrom" in entry:
            env[entry["name"]] = secrets.access(entry["valueFrom"]["secretKeyRef"]["name"]).decode()
        else:
            env[entry["name"]] = entry["value"]
    _, _, query = env["FUSEE_URL"].partition("?")
    for path, local in mounts.items():
        query = query.replace(f"={path}/", f"={local}/")
    env["FUSEE_URL"] = f"{server_address}?{query}"
    return env


@pytest.fixture
def container_of(image: Image) -> Iterator[Callable[[dict[str, str]], Container]]:
    started: list[Container] = []

    def start(env: dict[str, str]) -> Container:
        container = Container(image, image.environment(**env))
        started.append(container)
        container.wait_for(r"Uvicorn running on")
        return container

    yield start
    for container in started:
        container.stop()


def timer_invocations(server: Server, shard: int) -> int:
    """Invocations the server sent for `shard` because a reported due time came."""
    return sum(1 for _, shards, reasons in sends(server) if "timer" in reasons and shard in shards)


async def test_orders_run_to_their_results_in_the_container(
    image: Image,
    container_of: Callable[[dict[str, str]], Container],
    procs: list[Proc],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = certs.make(tmp_path / "certs")
    token = b"worker-token-0123456789abcdef0123"
    secrets = SecretManager(
        {
            "fusee-invoke-secret": b"cloudrun-invoke-secret-0123456789abcdef",
            "fusee-worker-token": token,
            "fusee-ca": Path(made.ca).read_bytes(),
        }
    )
    server_port = free_port()
    svc = service()
    env = deployed_environment(svc, image, secrets, f"127.0.0.1:{server_port}")
    env["PORT"] = str(free_port())  # Cloud Run's PORT is the containerPort; here, a free one
    container = container_of(env)
    # The shell exec'd uvicorn: it is the process Cloud Run signals, not a shell.
    assert b"uvicorn" in Path(f"/proc/{container.popen.pid}/cmdline").read_bytes()

    (tmp_path / "invoke-secret").write_bytes(secrets.values["fusee-invoke-secret"])
    (tmp_path / "token").write_bytes(token)
    (tmp_path / "token").chmod(0o600)
    given = options(server_line())
    ours = {
        "--tls-cert": made.server.cert,
        "--tls-key": made.server.key,
        "--token-file": str(tmp_path / "token"),
        "--invoke": f"http://127.0.0.1:{env['PORT']}/",
        "--invoke-secret-file": str(tmp_path / "invoke-secret"),
    }
    assert {*ours, "--dir", "--listen"} <= set(given), f"README's server line: {given}"
    # Every option of the line, with this test's files and addresses in place of the
    # README's; --dir and --listen are `Server`'s own arguments.
    args = [
        a
        for name, value in given.items()
        if name not in ("--dir", "--listen")
        for a in (name, ours.get(name, value))
    ]
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "1")  # the server's sends and their reasons
    server = Server(tmp_path / "data", *args, *LEASE_LINES, listen=f"127.0.0.1:{server_port}")
    procs.append(server)
    address = f"127.0.0.1:{server_port}?ca={made.ca}&token-file={tmp_path / 'token'}"
    client = await retry(lambda: fusee.Client.connect(address))
    try:
        # Bounded: a start or a result waits for a holder as long as invocations fail.
        await asyncio.wait_for(_orders(client, server, container), 20)
    except TimeoutError:
        raise AssertionError(f"orders unfinished:\n{server.output()}\n---\n{container.output()}") from None
    finally:
        await client.close()
    assert secrets.read == set(secrets.values)  # every secret the deployment names, used


async def _orders(client: fusee.Client, server: Server, container: Container) -> None:
    orders = {
        "o-ship": {"order_id": "o-ship", "item": "lamp", "quantity": 2},
        "o-declined": {"order_id": "o-declined", "item": "lamp", "quantity": 1, "card": "declined"},
        # A second's cooling-off, then half a second for the warehouse: the invocation
        # that starts it leaves while it sleeps, and the server invokes its shard again.
        "o-cool": {
            "order_id": "o-cool",
            "item": "vase",
            "quantity": 1,
            "cooling_off_s": 1.0,
            "ship_within_s": 0.5,
        },
    }
    began = time.monotonic()
    await asyncio.gather(*(client.start("order", wid, order) for wid, order in orders.items()))

    declined = await client.run("o-declined").result()
    assert (declined["status"], declined["charged_cents"], declined["undone"]) == ("declined", 0, ["release"])

    # While o-cool sleeps and o-ship waits for the warehouse, nothing holds a shard.
    await eventually(lambda: held_by_nobody(server), timeout=15.0, every=0.05)
    cool_shard = client.shard_of("o-cool")
    # Woken by its timer, not by a call of ours: nothing asked for o-cool meanwhile.
    await eventually(
        lambda: timer_invocations(server, cool_shard) >= 1,
        why=lambda: "\n".join(server.lines),
        timeout=15.0,
        every=0.05,
    )
    cool = await client.run("o-cool").result()
    assert time.monotonic() - began >= 1.5  # the durable timers held it that long
    assert (cool["status"], cool["charged_cents"]) == ("not shipped", 1250)
    assert cool["undone"] == ["refund", "release"]

    await client.run("o-ship").signal("shipped", "TRK-1")
    shipped = await client.run("o-ship").result()
    assert (shipped["status"], shipped["tracking"], shipped["charged_cents"]) == ("shipped", "TRK-1", 2500)

    await eventually(lambda: held_by_nobody(server), timeout=15.0, every=0.05)
    answered = [line for line in container.lines if "POST / HTTP/1.1" in line]
    assert answered and all(" 200" in line for line in answered), container.output()


# -- service.yaml against the server's invoke settings ----------------------------------


def test_service_yaml_matches_the_servers_invoke_settings() -> None:
    svc = service()
    assert (svc["apiVersion"], svc["kind"]) == ("serving.knative.dev/v1", "Service")
    annotations, spec, _ = template(svc)
    given = options(server_line())
    concurrency = int(given.get("--invoke-concurrency", CONCURRENCY))
    budget_ms = int(given.get("--invoke-budget-ms", BUDGET_MS))
    assert "--invoke-config" not in given  # the settings are the line's, or the defaults
    grace_ms = int(given.get("--invoke-grace-ms", GRACE_MS))

    assert annotations["autoscaling.knative.dev/minScale"] == "0"  # nothing runs while nothing is due
    max_scale = int(annotations["autoscaling.knative.dev/maxScale"])
    # README: Cloud Run takes as many invocations at once as the server sends, no fewer.
    assert spec["containerConcurrency"] * max_scale == concurrency
    assert 1 <= spec["containerConcurrency"] <= concurrency
    # The server's deadline (budget + grace) ends a stuck invocation before Cloud Run's.
    assert (budget_ms + grace_ms) / 1000 <= spec["timeoutSeconds"] <= 3600
    assert annotations["run.googleapis.com/cpu-throttling"] == "true"  # CPU only in requests
    assert annotations["run.googleapis.com/startup-cpu-boost"] == "true"
    # The server sends no ID token: the IAM check is off and the signature stands in.
    assert svc["metadata"]["annotations"]["run.googleapis.com/invoker-iam-disabled"] == "true"


def test_service_yaml_runs_the_images_command_with_its_secret_from_secret_manager() -> None:
    _, spec, container = template(service())
    assert "command" not in container and "args" not in container  # the Dockerfile's CMD runs
    cmd = parse(DOCKERFILE.read_text()).cmd[-1]
    default_port = re.search(r"\$\{PORT:-(\d+)\}", cmd)
    assert default_port and container["ports"][0]["containerPort"] == int(default_port.group(1))
    env = {entry["name"]: entry for entry in container["env"]}
    assert "PORT" not in env  # Cloud Run sets it, and refuses a service that does
    secret = env["FUSEE_INVOKE_SECRET"]
    assert "value" not in secret and set(secret["valueFrom"]["secretKeyRef"]) == {"name", "key"}
    address = parse_address(env["FUSEE_URL"]["value"])
    assert address.tls and address.token_file and address.invocation is None
    mounted = {
        f"{mount['mountPath']}/{item['path']}"
        for mount in container["volumeMounts"]
        for volume in spec["volumes"]
        if volume["name"] == mount["name"]
        for item in volume["secret"]["items"]
    }
    assert {address.ca, address.token_file} <= mounted  # files the service mounts
