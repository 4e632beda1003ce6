"""examples/lambda/deploy.py, run as a user runs it (a subprocess):

- against moto serving the AWS APIs over HTTP on loopback (the edge we fake): what it
  makes, how a second run updates it, and that `--teardown` leaves nothing, and nothing
  it did not make is touched;
- the zip it builds: its contents, its wheels' platform tags, and the zip alone, in an
  interpreter that sees nothing else, answering invocations from a real `fusee server`
  that runs the order app through it.

The wheels are downloaded from PyPI once and kept in pytest's cache directory; later
sessions build the zip offline in under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import fusee
from fusee.protocol import signature
from tests.support.cluster import quiet
from tests.support.procs import Proc, Server, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "lambda" / "deploy.py"
FRONT = Path(__file__).with_name("lambda_front.py")
SECRET = "lambda-deploy-test-secret-0123456789abcdef"
REGION = "eu-west-1"
PYTHON = f"python{sys.version_info[0]}.{sys.version_info[1]}"  # the zip this interpreter can import
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
OTHER = "python3.13" if PYTHON == "python3.12" else "python3.12"  # a runtime this is not

# The first session downloads the wheels (a few MB from PyPI); the test that waits for
# them gets longer than the suite's default.
pytestmark = pytest.mark.timeout(240)


@dataclass
class Ran:
    code: int
    out: str
    err: str


def aws_environment(tmp: Path) -> dict[str, str]:
    """Fake credentials, and no profile, config or instance metadata of this machine's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FUSEE_"))}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def deploy(env: dict[str, str], *args: str | Path) -> Ran:
    done = subprocess.run(
        [sys.executable, str(DEPLOY), *map(str, args)], env=env, capture_output=True, text=True, timeout=200
    )
    return Ran(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="session")
def wheel_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)
    if cache is not None:  # kept between sessions: the next one needs no network
        return Path(cache.mkdir("fusee-lambda-wheels"))
    return tmp_path_factory.mktemp("fusee-lambda-wheels")


@pytest.fixture(scope="session")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("credentials")
    (tmp / "secret").write_text(SECRET + "\n")
    (tmp / "token").write_text("worker-token-0123456789abcdef\n")
    (tmp / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n(a test CA)\n-----END CERTIFICATE-----\n")
    return {"secret": tmp / "secret", "token": tmp / "token", "ca": tmp / "ca.pem"}


@dataclass
class Built:
    path: Path
    infos: list[zipfile.ZipInfo]
    output: str

    @property
    def names(self) -> list[str]:
        return [info.filename for info in self.infos]

    def read(self, name: str) -> bytes:
        with zipfile.ZipFile(self.path) as archive:
            return archive.read(name)

    def extract(self, into: Path) -> None:
        with zipfile.ZipFile(self.path) as archive:
            archive.extractall(into)


def build(tmp: Path, cache: Path, credentials: dict[str, Path], *extra: str) -> Built:
    out = tmp / "function.zip"
    ran = deploy(
        aws_environment(tmp),
        "--build-only",
        *("--zip", out, "--cache-dir", cache, "--server", "127.0.0.1:7600"),
        *("--secret-file", credentials["secret"], "--token-file", credentials["token"]),
        *("--ca", credentials["ca"], *extra),
    )
    assert ran.code == 0, ran.err
    with zipfile.ZipFile(out) as archive:
        return Built(out, archive.infolist(), ran.out)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path, credentials: dict[str, Path]) -> Built:
    return build(tmp_path_factory.mktemp("zip"), wheel_cache, credentials, "--runtime", PYTHON)


def wheel_tags(built: Built) -> dict[str, list[str]]:
    """The `Tag:` lines of each installed wheel's WHEEL file, by distribution."""
    found: dict[str, list[str]] = {}
    for name in built.names:
        if name.endswith(".dist-info/WHEEL"):
            text = built.read(name).decode()
            found[name.split("-")[0]] = re.findall(r"^Tag: (.+)$", text, re.M)
    return found


# -- the zip ------------------------------------------------------------------------------------


def test_the_zip_holds_the_app_the_handlers_fusee_and_wheels_for_the_runtime(built, credentials):
    names = set(built.names)
    assert {"orders.py", "handlers/__init__.py", "handlers/aws_lambda.py", "fusee/__init__.py"} <= names
    assert {"msgspec/__init__.py", "google_crc32c/__init__.py", "mangum/__init__.py"} <= names
    assert not [n for n in names if "fusee_server" in n or "fusee-server" in n.split("/")[0]]
    assert built.read("orders.py") == (ROOT / "examples" / "orders" / "orders.py").read_bytes()
    assert built.read("fusee-deploy/invoke-secret") == credentials["secret"].read_bytes()
    assert built.read("fusee-deploy/token") == credentials["token"].read_bytes()
    assert built.read("fusee-deploy/ca.pem") == credentials["ca"].read_bytes()
    # Every package of ours comes whole from this checkout.
    for package in ("fusee", "handlers"):
        ours = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")}
        assert ours <= names, sorted(ours - names)
    tags = wheel_tags(built)
    assert set(tags) >= {"msgspec", "google_crc32c", "mangum"}, tags
    for compiled in ("msgspec", "google_crc32c"):
        assert tags[compiled], compiled
        for tag in tags[compiled]:
            assert re.fullmatch(rf"{CP}-{CP}-manylinux.*_x86_64", tag), (compiled, tag)
    assert tags["mangum"] == ["py3-none-any"]
    # Readable by the runtime's user, who does not own the files.
    assert {info.external_attr >> 16 for info in built.infos} == {0o100644}
    assert (built.path.stat().st_mode & 0o777) == 0o600  # it holds the credentials
    size = built.path.stat().st_size
    assert f"zip: {size:,} bytes" in built.output
    # --build-only: what to give a function that runs it, deployed some other way.
    assert f"handler handlers.aws_lambda.handler, runtime {PYTHON}, timeout 90 s" in built.output
    assert "  FUSEE_URL=127.0.0.1:7600?ca=/var/task/fusee-deploy/ca.pem&token-file=" in built.output
    assert "  FUSEE_INVOKE_SECRET_FILE=/var/task/fusee-deploy/invoke-secret" in built.output
    assert SECRET not in built.output
    assert size < 5 * 2**20, size  # far under Lambda's 50 MB for a direct upload


def test_the_zip_carries_bytecode_for_the_runtime_and_no_other(built):
    """Compiled here, by the runtime's Python: hash-based and unchecked (PEP 552), one per
    source, none left over from the checkout (a stale one would never be checked)."""
    names = set(built.names)
    sources = {n for n in names if n.endswith(".py")}
    pycs = {n for n in names if n.endswith(".pyc")}
    tag = sys.implementation.cache_tag
    expected = set()
    for source in sources:
        folder, _, file = source.rpartition("/")
        expected.add((f"{folder}/" if folder else "") + f"__pycache__/{file[:-3]}.{tag}.pyc")
    assert pycs == expected
    for source in ("orders.py", "fusee/engine/engine.py", "msgspec/__init__.py"):
        folder, _, file = source.rpartition("/")
        pyc = built.read((f"{folder}/" if folder else "") + f"__pycache__/{file[:-3]}.{tag}.pyc")
        assert pyc[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, unchecked
        assert pyc[8:16] == importlib.util.source_hash(built.read(source))
        assert marshal.loads(pyc[16:]).co_filename == f"/var/task/{source}"
    assert "with bytecode" in built.output


def test_the_zip_is_the_same_when_built_again(built, wheel_cache, credentials, tmp_path):
    again = build(tmp_path, wheel_cache, credentials, "--runtime", PYTHON)
    digest = [hashlib.sha256(b.path.read_bytes()).hexdigest() for b in (built, again)]
    assert digest[0] == digest[1]  # so a redeploy of unchanged code uploads nothing


def test_arm64_and_another_python_take_their_own_wheels(wheel_cache, credentials, tmp_path):
    other = build(tmp_path, wheel_cache, credentials, "--arch", "arm64", "--runtime", OTHER)
    tags = wheel_tags(other)
    cp = "cp" + OTHER.removeprefix("python").replace(".", "")
    for compiled in ("msgspec", "google_crc32c"):
        assert tags[compiled]
        for tag in tags[compiled]:
            assert re.fullmatch(rf"{cp}-{cp}-manylinux.*_aarch64", tag), (compiled, tag)
    # Bytecode is for one version of Python: this one's is not the runtime's.
    assert f"for {OTHER} on arm64, without bytecode" in other.output
    assert not [n for n in other.names if "__pycache__" in n or n.endswith(".pyc")]


# -- the zip alone, answering a real server ------------------------------------------------------


@pytest.fixture
def procs(procs: list[Proc]) -> Iterator[list[Proc]]:
    """The shared fixture's processes, each stopped with SIGTERM (which it must obey)."""
    yield procs
    for proc in reversed(procs):
        proc.stop()


class Front(Proc):
    """tests/examples/lambda_front.py: the extracted zip behind a stand-in function URL."""

    def __init__(self, zip_dir: Path, port: int, server_port: int, secret_file: Path) -> None:
        env = {
            "FUSEE_URL": f"127.0.0.1:{server_port}",
            "FUSEE_INVOKE_SECRET_FILE": str(secret_file),
            "FUSEE_WORKFLOWS": "orders",
            "FUSEE_INVOKE_TRACE": "1",
        }
        args = [sys.executable, "-I", "-S", str(FRONT), str(zip_dir), str(port)]
        super().__init__(args, {"PYTHONPATH": "", **env})
        self.port = port

    def ready(self) -> dict[str, Any]:
        """Where each module the handler loaded came from, and what else was importable."""
        report: dict[str, Any] = json.loads(self.wait_for(r"^ready (.*)$").group(1))
        return report

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/", body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def invocation(invocation_id: str, shards: list[int]) -> bytes:
    request = {"version": 1, "invocation": invocation_id, "shards": shards, "budgetMs": 10_000}
    return json.dumps(request).encode()


async def test_the_zip_alone_runs_the_order_app_for_a_real_server(built, procs, tmp_path):
    zip_dir = tmp_path / "task"
    built.extract(zip_dir)
    server_port, front_port = free_port(), free_port()
    secret = zip_dir / "fusee-deploy" / "invoke-secret"  # the server signs with the zip's own
    front = Front(zip_dir, front_port, server_port, secret)
    procs.append(front)
    report = front.ready()
    # Everything the handler ran came from the zip: no site-packages, not this checkout.
    assert report["outside"] == {}, report
    assert report["server_importable"] is False
    assert not [p for p in report["path"] if "site-packages" in p or p == str(ROOT)]

    server = Server(
        tmp_path / "data",
        *("--invoke", f"http://127.0.0.1:{front_port}/", "--invoke-secret-file", str(secret)),
        shards=2,
        listen=f"127.0.0.1:{server_port}",
    )
    procs.append(server)

    # Refused before anything is connected to; then refused by the server.
    body = invocation("feedfacefeedface", [0])
    bad = signature.sign(b"not-the-secret-0123456789abcdef", body)
    assert front.post(body, {signature.HEADER: bad}) == (401, {"error": "unauthorized"})
    status, answer = front.post(body, {signature.HEADER: signature.sign(SECRET.encode(), body)})
    assert status == 502, answer

    client = await fusee.Client.connect(server.address())
    try:
        order = {"order_id": "o-1", "item": "lamp", "quantity": 2, "card": "flaky", "cooling_off_s": 1.0}
        run = await client.start("order", "o-1", order)
        await front.wait_for_async(r"fusee invoke \S+ .*answered status=200")
        await run.signal("shipped", "TRK-9")
        result = await run.result()
        assert (result["status"], result["tracking"], result["charged_cents"]) == ("shipped", "TRK-9", 2500)
        counts = await settled(client)
    finally:
        await client.close()
    # Each stretch of work was its own invocation: the start (the charge retried twice),
    # the end of the cooling-off sleep (a timer), the signal; every one answered 200.
    assert counts["succeeded"] >= 3 and counts["failed"] == 0 and counts["steps"] >= 4, counts
    assert [line for line in front.lines if "reasons=['timer']" in line], front.output()
    assert not [line for line in front.lines if re.search(r"front answered (?!200|401|502)", line)]


async def settled(client: fusee.Client) -> dict[str, Any]:
    """The endpoint's counts once nothing is due or being invoked."""
    endpoint: dict[str, Any] = (await quiet(client))["endpoints"][0]
    return endpoint


# -- AWS, faked by moto on loopback ----------------------------------------------------------


class Moto(Proc):
    """`python -m moto.server` on a loopback port, as it starts by default: without AWS's
    managed policies (deploy.py attaches none; its role's one policy is inline)."""

    def __init__(self) -> None:
        self.port = free_port()
        args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(args, {"MOTO_IAM_LOAD_MANAGED_POLICIES": "false"})
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=5).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.popen.poll() is not None:
                    raise AssertionError(f"moto did not start:\n{self.output()}") from None
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        urllib.request.urlopen(
            urllib.request.Request(f"{self.url}/moto-api/reset", b"", method="POST")
        ).close()


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    server = Moto()
    yield server
    server.stop()
    server.close()


@dataclass
class Aws:
    env: dict[str, str]
    url: str
    cache: Path
    credentials: dict[str, Path]

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def deploy(self, *args: str | Path) -> Ran:
        common = ("--region", REGION, "--endpoint-url", self.url, "--cache-dir", self.cache)
        return deploy(self.env, *common, *args)

    def deploy_app(self, *args: str | Path) -> Ran:
        c = self.credentials
        return self.deploy(
            *("--server", "fusee.example.com:7600", "--secret-file", c["secret"]),
            *("--token-file", c["token"], "--ca", "system", *args),
        )


@pytest.fixture
def aws(moto: Moto, wheel_cache: Path, credentials: dict[str, Path], built: Built, tmp_path: Path) -> Aws:
    # (`built`: the wheels are downloaded in its setup, not inside a deploy's timeout.)
    moto.reset()  # every test starts from an empty account
    return Aws(aws_environment(tmp_path), moto.url, wheel_cache, credentials)


def missing(call: Any, error_code: str) -> bool:
    try:
        call()
    except ClientError as error:
        return bool(error.response["Error"]["Code"] == error_code)
    return False


def statements(fn: Any, name: str) -> list[str]:
    try:
        policy = json.loads(fn.get_policy(FunctionName=name)["Policy"])
    except ClientError:
        return []
    return sorted(s["Sid"] for s in policy["Statement"])


def test_deploy_makes_the_function_a_second_run_updates_it_and_teardown_leaves_nothing(aws):
    fn, iam, logs = aws.client("lambda"), aws.client("iam"), aws.client("logs")
    first = aws.deploy_app()
    assert first.code == 0, first.err

    role = iam.get_role(RoleName="fusee-orders-role")["Role"]
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    # Its logs and nothing else: one inline policy, on the function's own log group.
    assert iam.list_attached_role_policies(RoleName="fusee-orders-role")["AttachedPolicies"] == []
    assert iam.list_role_policies(RoleName="fusee-orders-role")["PolicyNames"] == ["fusee-logs"]
    policy = iam.get_role_policy(RoleName="fusee-orders-role", PolicyName="fusee-logs")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    account = role["Arn"].split(":")[4]
    group = f"arn:aws:logs:{REGION}:{account}:log-group:/aws/lambda/fusee-orders"
    assert policy["Statement"] == [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [group, f"{group}:*"],
        }
    ]
    assert {"Key": "fusee-example", "Value": "orders"} in iam.list_role_tags(RoleName="fusee-orders-role")[
        "Tags"
    ]

    found = fn.get_function(FunctionName="fusee-orders")
    config = found["Configuration"]
    assert found["Tags"] == {"fusee-example": "orders"}
    assert (config["Handler"], config["Runtime"], config["Role"]) == (
        "handlers.aws_lambda.handler",
        "python3.11",
        role["Arn"],
    )
    assert config["Timeout"] == 90  # the 60 s budget and the server's 30 s grace
    assert config["MemorySize"] == 512 and config["Architectures"] == ["x86_64"]
    assert config["Environment"]["Variables"] == {
        "FUSEE_URL": (
            "fusee.example.com:7600?ca=/etc/pki/tls/certs/ca-bundle.crt"
            "&token-file=/var/task/fusee-deploy/token"
        ),
        "FUSEE_WORKFLOWS": "orders",
        "FUSEE_INVOKE_SECRET_FILE": "/var/task/fusee-deploy/invoke-secret",
        "FUSEE_INVOKE_TRACE": "1",
    }
    assert SECRET not in json.dumps(config)
    url = fn.get_function_url_config(FunctionName="fusee-orders")
    assert url["AuthType"] == "NONE"
    assert statements(fn, "fusee-orders") == ["fusee-url", "fusee-url-invoke"]
    groups = logs.describe_log_groups(logGroupNamePrefix="/aws/lambda/fusee-orders")["logGroups"]
    assert [(g["logGroupName"], g.get("retentionInDays")) for g in groups] == [
        ("/aws/lambda/fusee-orders", 14)
    ]
    # The lines to run the server with: through the URL, and by direct invoke.
    assert f"--invoke {url['FunctionUrl']}" in first.out
    assert f"--invoke lambda:fusee-orders --invoke-region {REGION}" in first.out
    assert "--invoke-budget-ms 60000" in first.out
    assert (
        "--tls-cert SERVER_CERT.pem" in first.out and f"--token-file {aws.credentials['token']}" in first.out
    )

    second = aws.deploy_app("--memory-mb", "1024", "--budget-ms", "120000")
    assert second.code == 0, second.err
    config = fn.get_function(FunctionName="fusee-orders")["Configuration"]
    assert (config["MemorySize"], config["Timeout"]) == (1024, 150)
    assert "updated the configuration" in second.out and "created" not in second.out
    assert statements(fn, "fusee-orders") == ["fusee-url", "fusee-url-invoke"]  # not added twice
    assert fn.get_function_url_config(FunctionName="fusee-orders")["FunctionUrl"] == url["FunctionUrl"]

    gone = aws.deploy("--teardown")
    assert gone.code == 0, gone.err
    assert "deleted function fusee-orders and its URL" in gone.out
    assert missing(
        lambda: fn.get_function_url_config(FunctionName="fusee-orders"), "ResourceNotFoundException"
    )
    assert missing(lambda: fn.get_function(FunctionName="fusee-orders"), "ResourceNotFoundException")
    assert missing(lambda: iam.get_role(RoleName="fusee-orders-role"), "NoSuchEntity")
    assert logs.describe_log_groups(logGroupNamePrefix="/aws/lambda/fusee-orders")["logGroups"] == []
    assert fn.list_functions()["Functions"] == []
    assert [r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("fusee")] == []
    again = aws.deploy("--teardown")  # nothing left to delete is not an error
    assert again.code == 0, again.err


def test_no_url_takes_the_url_and_its_public_permissions_away(aws):
    fn, iam = aws.client("lambda"), aws.client("iam")
    assert aws.deploy_app().code == 0
    # As an earlier deploy.py left the role: AWSLambdaBasicExecutionRole attached (logs on
    # every group). The next run detaches it, leaving the inline policy only.
    basic = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "logs:*", "Resource": "*"}]}
    managed = iam.create_policy(PolicyName="AWSLambdaBasicExecutionRole", PolicyDocument=json.dumps(basic))
    iam.attach_role_policy(RoleName="fusee-orders-role", PolicyArn=managed["Policy"]["Arn"])
    direct = aws.deploy_app("--no-url")
    assert direct.code == 0, direct.err
    assert iam.list_attached_role_policies(RoleName="fusee-orders-role")["AttachedPolicies"] == []
    assert iam.list_role_policies(RoleName="fusee-orders-role")["PolicyNames"] == ["fusee-logs"]
    assert missing(
        lambda: fn.get_function_url_config(FunctionName="fusee-orders"), "ResourceNotFoundException"
    )
    assert statements(fn, "fusee-orders") == []
    assert "--invoke lambda:fusee-orders" in direct.out and "lambda-url" not in direct.out
    assert fn.get_function(FunctionName="fusee-orders")["Configuration"]["State"] == "Active"
    assert aws.deploy("--teardown").code == 0
    assert fn.list_functions()["Functions"] == []


def test_what_deploy_did_not_make_is_never_changed_or_deleted(aws, built):
    iam, fn = aws.client("iam"), aws.client("lambda")
    trust = json.dumps(
        {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "lambda.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }
            ]
        }
    )
    role = iam.create_role(RoleName="someone-else-role", AssumeRolePolicyDocument=trust)["Role"]
    fn.create_function(
        FunctionName="someone-else",
        Runtime="python3.11",
        Role=role["Arn"],
        Handler="app.handler",
        Code={"ZipFile": built.path.read_bytes()},
        MemorySize=128,
    )
    for args in (["--name", "someone-else"], ["--name", "someone-else", "--teardown"]):
        ran = aws.deploy_app(*args) if "--teardown" not in args else aws.deploy(*args)
        assert ran.code == 2, ran.out + ran.err
        assert "not made by deploy.py" in ran.err
    config = fn.get_function(FunctionName="someone-else")["Configuration"]
    assert (config["MemorySize"], config["Handler"]) == (128, "app.handler")
    assert iam.get_role(RoleName="someone-else-role")["Role"]["Arn"] == role["Arn"]


def test_a_client_without_ca_gets_a_server_line_without_tls(aws):
    """The function connects without TLS (and here without a token): the server it is told
    to run must listen the same way, or the function is refused at every invocation."""
    c = aws.credentials
    ran = aws.deploy("--server", "fusee.example.com:7600", "--secret-file", c["secret"])
    assert ran.code == 0, ran.err
    config = aws.client("lambda").get_function(FunctionName="fusee-orders")["Configuration"]
    assert config["Environment"]["Variables"]["FUSEE_URL"] == "fusee.example.com:7600"
    assert "--tls-cert" not in ran.out and "--tls-key" not in ran.out
    assert "--token-file" not in ran.out
    assert "without TLS" in ran.out and "--invoke lambda:fusee-orders" in ran.out
    assert aws.deploy("--teardown").code == 0


# -- the app's workflows, imported before anything is built ------------------------------------


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        ("nowhere", None, "--workflows nowhere: no nowhere.py in --app"),
        ("json", None, "--workflows json: no json.py in --app"),  # importable, but not the app's
        ("app.flows", None, "--workflows app.flows: no app.flows.py in --app"),
        ("broken", "import no_such_package\n", "cannot import 'broken': ModuleNotFoundError"),
        ("empty", "X = 1\n", "module 'empty' defines no workflow"),
    ],
)
def test_workflows_that_the_function_could_not_import_are_refused_before_the_zip(
    tmp_path, wheel_cache, credentials, module, source, message
):
    app = tmp_path / "app"
    app.mkdir()
    (app / "orders.py").write_bytes((ROOT / "examples" / "orders" / "orders.py").read_bytes())
    if source is not None:
        (app / f"{module}.py").write_text(source)
    out = tmp_path / "function.zip"
    ran = deploy(
        aws_environment(tmp_path),
        "--build-only",
        *("--zip", out, "--cache-dir", wheel_cache, "--server", "127.0.0.1:7600"),
        *("--secret-file", credentials["secret"], "--app", app, "--workflows", f"orders,{module}"),
    )
    assert ran.code == 2, ran.out + ran.err
    assert message in ran.err
    assert not out.exists() and "zip:" not in ran.out
