"""Deploy a fusee workflow app (by default examples/orders) to AWS Lambda as an invoked,
scale-to-zero worker, update it, or tear it down. See README.md beside this file.

    python examples/lambda/deploy.py --region eu-west-1 --server fusee.example.com:7600 \\
        --ca ca.pem --token-file token --secret-file invoke-secret
    python examples/lambda/deploy.py --region eu-west-1 --teardown

What it makes, each tagged `fusee-example=<app>` so that a later run updates only what it
made and `--teardown` deletes only that: an IAM role the function runs as (one inline
policy: writing to its own log group, nothing else), the log group with a retention, the
function (`handlers.aws_lambda.handler`) and its function URL.

Before anything is built, the `--workflows` modules are imported from `--app` as the
function will import them (`handlers.import_workflows`), so a misspelt module or one that
fails at import stops here rather than at the function's first start.

The deployment zip holds the app's modules at its root, `handlers/` and `fusee/` from this
checkout (never the server), fusee's dependencies and mangum installed from wheels built
for the runtime's Python and architecture, and the credentials the function connects to
the server with, under `fusee-deploy/`: the invocation secret, the worker token, the CA.
They are files because an address only names its token by file (`token-file=`); keeping
the secret beside them keeps every credential out of the function's environment, which
the console shows to whoever may read the function's configuration.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import io
import json
import marshal
import math
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from fusee import _secrets

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "examples" / "orders"

RUNTIMES = {"python3.11": "3.11", "python3.12": "3.12", "python3.13": "3.13"}
PLATFORMS = {"x86_64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}
TAG_KEY = "fusee-example"
TASK_ROOT = "/var/task"  # where Lambda unpacks the zip
CREDENTIALS_DIR = "fusee-deploy"  # not an identifier: nothing can import it by accident
# The bundle of public CAs in every Amazon Linux image the Python runtimes use (2 and 2023).
SYSTEM_CA = "/etc/pki/tls/certs/ca-bundle.crt"
LAMBDA_TIMEOUT_S_MAX = 900
# What earlier versions attached (logs on every log group of the account); detached on
# update. The role now holds one inline policy, scoped to the function's own log group:
# narrower, and it needs no AWS managed policy to exist (a plain moto server has none).
BASIC_EXECUTION = "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
LOGS_POLICY = "fusee-logs"
TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
# A function URL with AuthType NONE needs both, since October 2025: the URL's own action and
# InvokeFunction restricted to calls that come through the URL.
URL_PERMISSIONS = (
    ("fusee-url", {"Action": "lambda:InvokeFunctionUrl", "FunctionUrlAuthType": "NONE"}),
    ("fusee-url-invoke", {"Action": "lambda:InvokeFunction", "InvokedViaFunctionUrl": True}),
)
# A newly created role takes a few seconds to be usable by Lambda (IAM is eventually
# consistent); CreateFunction says "cannot be assumed" until then.
ROLE_PROPAGATION_S = 90
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: the same inputs give the same zip, and the same CodeSha256


class Stop(Exception):
    """A reason to stop, said to the user without a traceback."""


# -- the deployment zip ---------------------------------------------------------------------


def requirements() -> list[str]:
    """fusee's runtime dependencies and its `lambda` extra (mangum), from pyproject.toml,
    so that the zip follows the package's own pins."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: list[str] = [*project["dependencies"], *project["optional-dependencies"]["lambda"]]
    return found


def dependencies(cache: Path, runtime: str, arch: str) -> Path:
    """A directory holding the requirements installed for the runtime's Python and
    architecture, built once per (requirements, runtime, architecture) and kept in `cache`.
    Wheels only (`--only-binary`): pip never builds a compiled package for this machine."""
    wanted = requirements()
    key = hashlib.sha256(json.dumps([wanted, runtime, arch]).encode()).hexdigest()[:16]
    site = cache / f"site-{runtime}-{arch}-{key}"
    if site.is_dir():
        return site
    wheels = cache / f"wheels-{runtime}-{arch}"
    target = cache / f".partial-{key}-{os.getpid()}"
    shutil.rmtree(target, ignore_errors=True)
    platform = [
        *("--platform", PLATFORMS[arch], "--implementation", "cp"),
        *("--python-version", RUNTIMES[runtime], "--only-binary=:all:"),
    ]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    install = [*pip, "install", "--no-compile", "--target", str(target), *platform]
    offline = [*install, "--no-index", "--find-links", str(wheels), *wanted]
    # The wheels already downloaded first: a re-run after a cleared site needs no network.
    if not wheels.is_dir() or subprocess.run(offline, capture_output=True).returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        print(f"downloading wheels for {runtime} on {arch} into {wheels}", flush=True)
        run_pip([*pip, "download", "--dest", str(wheels), *platform, *wanted])
        run_pip(offline)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: nothing runs them
    for cache_dir in list(target.rglob("__pycache__")):
        shutil.rmtree(cache_dir)
    # Renamed into place only once complete: an interrupted build is never taken for one.
    os.replace(target, site)
    return site


def write_private(path: Path, data: bytes) -> None:
    """`data` in a file only its owner may read: the zip holds the credentials."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that was there keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def run_pip(args: list[str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise Stop(f"pip failed ({' '.join(args[3:6])} ...):\n{done.stderr.strip() or done.stdout.strip()}")


def files_under(base: Path, prefix: str = "") -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) for every file under `base`, without the bytecode found
    there: maybe another Python's, maybe stale, and an unchecked .pyc (see `compiled`)
    would be believed over its source."""
    for path in sorted(base.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        yield prefix + path.relative_to(base).as_posix(), path


@dataclass
class Credentials:
    """The files the function needs to reach the server: copied into the zip under
    CREDENTIALS_DIR and named in FUSEE_URL and FUSEE_INVOKE_SECRET_FILE by their path there."""

    secret_file: Path
    token_file: Path | None = None
    ca: str | None = None  # a PEM file, or "system": the runtime's public CAs
    cert: Path | None = None
    key: Path | None = None

    def files(self) -> dict[str, Path]:
        found = {"invoke-secret": self.secret_file}
        for name, path in (("token", self.token_file), ("cert.pem", self.cert), ("key.pem", self.key)):
            if path is not None:
                found[name] = path
        if self.ca is not None and self.ca != "system":
            found["ca.pem"] = Path(self.ca)
        return found

    def address(self, server: str) -> str:
        """FUSEE_URL: the server's host:port with the options that name the files."""
        where = f"{TASK_ROOT}/{CREDENTIALS_DIR}"
        options: list[str] = []
        if self.ca == "system":
            options.append(f"ca={SYSTEM_CA}")
        elif self.ca is not None:
            options.append(f"ca={where}/ca.pem")
        if self.cert is not None:
            options += [f"cert={where}/cert.pem", f"key={where}/key.pem"]
        if self.token_file is not None:
            options.append(f"token-file={where}/token")
        return server + ("?" + "&".join(options) if options else "")


def build_zip(
    app: Path, credentials: Credentials, cache: Path, runtime: str, arch: str, bytecode: bool
) -> bytes:
    site = dependencies(cache, runtime, arch)
    entries: dict[str, bytes] = {}
    for name, path in [
        *((p.name, p) for p in sorted(app.glob("*.py"))),
        *files_under(ROOT / "handlers", "handlers/"),
        *files_under(ROOT / "fusee", "fusee/"),
        *files_under(site),
        *((f"{CREDENTIALS_DIR}/{n}", p) for n, p in credentials.files().items()),
    ]:
        if name in entries:
            raise Stop(f"{name} would be in the zip twice (the second from {path})")
        entries[name] = path.read_bytes()
    if any(name.split("/")[0].startswith("fusee_server") for name in entries):
        raise Stop("the server's package ended up in the zip: it must never be on the function's path")
    if bytecode:
        for name, source in list(entries.items()):
            if name.endswith(".py"):
                entries[cached_name(name)] = compiled(name, source)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in sorted(entries.items()):
            info = zipfile.ZipInfo(name, ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            # Readable by all: the runtime reads /var/task as another user than the owner.
            info.external_attr = 0o100644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def cached_name(name: str) -> str:
    """Where the import system looks for `name`'s bytecode: __pycache__/<stem>.<tag>.pyc."""
    folder, _, file = name.rpartition("/")
    pyc = f"__pycache__/{file.removesuffix('.py')}.{sys.implementation.cache_tag}.pyc"
    return f"{folder}/{pyc}" if folder else pyc


def compiled(name: str, source: bytes) -> bytes:
    """`source`'s bytecode as a hash-based, unchecked .pyc (PEP 552). /var/task is
    read-only, so without it every cold start compiles every module it imports again
    (about half of `import handlers.aws_lambda`); unchecked, because the zip's fixed
    timestamps say nothing about the sources, and its files never change once deployed.
    Tracebacks name the file where Lambda puts it."""
    # dont_inherit: this file's `from __future__` imports are not the module's.
    code = compile(source, f"{TASK_ROOT}/{name}", "exec", dont_inherit=True, optimize=0)
    flags = (0b01).to_bytes(4, "little")  # hash-based, source not checked
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)


# -- AWS --------------------------------------------------------------------------------------


def code(error: ClientError) -> str:
    found: str = error.response.get("Error", {}).get("Code", "")
    return found


def tags_of(response: dict[str, Any], key: str = "Tags") -> dict[str, str]:
    given = response.get(key) or {}
    if isinstance(given, list):  # IAM lists {"Key", "Value"} pairs, Lambda and Logs a mapping
        return {str(tag["Key"]): str(tag["Value"]) for tag in given}
    return {str(k): str(v) for k, v in given.items()}


class Deployment:
    """The AWS side: one function with its role, log group and URL, all named after
    `name` and tagged TAG_KEY=`app`. Something of that name without the tag was made by
    someone else: it is never changed or deleted."""

    def __init__(self, args: argparse.Namespace) -> None:
        session = boto3.Session(region_name=args.region)
        if session.region_name is None:
            raise Stop("no AWS region: give --region (or set AWS_REGION)")
        self.region: str = session.region_name
        self.name: str = args.name
        self.role_name = f"{args.name}-role"
        self.log_group = f"/aws/lambda/{args.name}"
        self.tag = {TAG_KEY: args.app_tag}
        self.iam = session.client("iam", endpoint_url=args.endpoint_url)
        self.fn = session.client("lambda", endpoint_url=args.endpoint_url)
        self.logs = session.client("logs", endpoint_url=args.endpoint_url)

    def mine(self, what: str, tags: dict[str, str]) -> None:
        if tags.get(TAG_KEY) != self.tag[TAG_KEY]:
            raise Stop(
                f"{what} exists without the tag {TAG_KEY}={self.tag[TAG_KEY]}: it was not made by "
                "deploy.py, so it is left alone (choose another --name)"
            )

    # -- role

    def role(self) -> str:
        """The role's ARN, made or brought up to date."""
        try:
            role = self.iam.get_role(RoleName=self.role_name)["Role"]
        except ClientError as error:
            if code(error) != "NoSuchEntity":
                raise
            role = self.iam.create_role(
                RoleName=self.role_name,
                AssumeRolePolicyDocument=json.dumps(TRUST_POLICY),
                Description="fusee worker on AWS Lambda (examples/lambda/deploy.py)",
                Tags=[{"Key": k, "Value": v} for k, v in self.tag.items()],
            )["Role"]
            self.iam.get_waiter("role_exists").wait(RoleName=self.role_name)
            print(f"created role {self.role_name}")
        else:
            self.mine(f"role {self.role_name}", tags_of(self.iam.list_role_tags(RoleName=self.role_name)))
            self.iam.update_assume_role_policy(
                RoleName=self.role_name, PolicyDocument=json.dumps(TRUST_POLICY)
            )
        arn: str = role["Arn"]
        self.iam.put_role_policy(
            RoleName=self.role_name, PolicyName=LOGS_POLICY, PolicyDocument=json.dumps(self._logs_policy(arn))
        )
        attached = self.iam.list_attached_role_policies(RoleName=self.role_name)["AttachedPolicies"]
        for policy in attached:
            if policy["PolicyName"] == BASIC_EXECUTION.rpartition("/")[2]:  # others' stay
                self.iam.detach_role_policy(RoleName=self.role_name, PolicyArn=policy["PolicyArn"])
        return arn

    def _logs_policy(self, role_arn: str) -> dict[str, Any]:
        """What the function may do: write its logs into its own log group (made here, or
        again by Lambda if someone deletes it), nothing else."""
        partition, account = role_arn.split(":")[1], role_arn.split(":")[4]
        group = f"arn:{partition}:logs:{self.region}:{account}:log-group:{self.log_group}"
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                    "Resource": [group, f"{group}:*"],
                }
            ],
        }

    # -- log group

    def logs_kept(self, days: int) -> None:
        """The function's log group, made here so that it has a retention (Lambda would
        make one that keeps everything, and bills its storage, forever) and goes at
        teardown."""
        try:
            self.logs.create_log_group(logGroupName=self.log_group, tags=self.tag)
        except ClientError as error:
            if code(error) != "ResourceAlreadyExistsException":
                raise
            tags = tags_of(self.logs.list_tags_log_group(logGroupName=self.log_group), "tags")
            if tags.get(TAG_KEY) != self.tag[TAG_KEY]:
                print(f"log group {self.log_group} exists and is not deploy.py's: left as it is")
                return
        self.logs.put_retention_policy(logGroupName=self.log_group, retentionInDays=days)

    # -- function

    def function(self, zipped: bytes, role: str, settings: dict[str, Any], arch: str) -> None:
        """Made, or its code and configuration updated; returns once it is ready."""
        try:
            current = self.fn.get_function(FunctionName=self.name)
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise
            self._create(zipped, role, settings, arch)
            return
        self.mine(f"function {self.name}", tags_of(current))
        config = current["Configuration"]
        sha = base64.b64encode(hashlib.sha256(zipped).digest()).decode()
        # Code first, then configuration: between the two (seconds), a changed --runtime
        # runs the new wheels on the old Python; such an invocation fails at import and the
        # server retries it after its backoff.
        if config.get("CodeSha256") != sha or config.get("Architectures", ["x86_64"]) != [arch]:
            self.fn.update_function_code(FunctionName=self.name, ZipFile=zipped, Architectures=[arch])
            self.fn.get_waiter("function_updated_v2").wait(FunctionName=self.name)
            print(f"updated the code of {self.name}")
        self.fn.update_function_configuration(FunctionName=self.name, Role=role, **settings)
        self.fn.get_waiter("function_updated_v2").wait(FunctionName=self.name)
        print(f"updated the configuration of {self.name}")

    def _create(self, zipped: bytes, role: str, settings: dict[str, Any], arch: str) -> None:
        deadline = time.monotonic() + ROLE_PROPAGATION_S
        while True:
            try:
                self.fn.create_function(
                    FunctionName=self.name,
                    Role=role,
                    Code={"ZipFile": zipped},
                    Architectures=[arch],
                    PackageType="Zip",
                    Tags=self.tag,
                    **settings,
                )
                break
            except ClientError as error:
                new_role = code(error) == "InvalidParameterValueException" and "role" in str(error)
                if not new_role or time.monotonic() > deadline:
                    raise
                time.sleep(3)
        self.fn.get_waiter("function_active_v2").wait(FunctionName=self.name)
        print(f"created function {self.name}")

    # -- URL

    def url(self) -> str:
        """The function URL, AuthType NONE: Lambda lets anyone reach the function, and the
        handler answers 401, before connecting to anything, to a request the server did not
        sign (see README: Why the URL is public)."""
        try:
            found = self.fn.get_function_url_config(FunctionName=self.name)
            if found["AuthType"] != "NONE":
                found = self.fn.update_function_url_config(FunctionName=self.name, AuthType="NONE")
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise
            found = self.fn.create_function_url_config(
                FunctionName=self.name, AuthType="NONE", InvokeMode="BUFFERED"
            )
        present = self._statements()
        for statement, permission in URL_PERMISSIONS:
            if statement not in present:
                self.fn.add_permission(
                    FunctionName=self.name, StatementId=statement, Principal="*", **permission
                )
        url: str = found["FunctionUrl"]
        return url

    def _statements(self) -> set[str]:
        """The statement IDs of the function's resource policy (none: no policy yet)."""
        try:
            policy = json.loads(self.fn.get_policy(FunctionName=self.name)["Policy"])
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise
            return set()
        return {str(statement.get("Sid")) for statement in policy.get("Statement", [])}

    def no_url(self) -> None:
        """Direct invoke only: the URL and its public permissions go, if there."""
        present = self._statements()
        for statement, _ in URL_PERMISSIONS:
            if statement in present:
                self.fn.remove_permission(FunctionName=self.name, StatementId=statement)
        self._gone(lambda: self.fn.delete_function_url_config(FunctionName=self.name))

    def arn(self) -> str:
        found: str = self.fn.get_function(FunctionName=self.name)["Configuration"]["FunctionArn"]
        return found

    # -- teardown

    def teardown(self) -> None:
        """Everything above that is deploy.py's, newest first; the rest is reported."""
        try:
            current = self.fn.get_function(FunctionName=self.name)
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise
            print(f"no function {self.name}")
        else:
            self.mine(f"function {self.name}", tags_of(current))
            self._gone(lambda: self.fn.delete_function_url_config(FunctionName=self.name))
            self.fn.delete_function(FunctionName=self.name)  # its permissions go with it
            print(f"deleted function {self.name} and its URL")
        try:
            tags = tags_of(self.logs.list_tags_log_group(logGroupName=self.log_group), "tags")
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise
            print(f"no log group {self.log_group}")
        else:
            if tags.get(TAG_KEY) == self.tag[TAG_KEY]:
                self.logs.delete_log_group(logGroupName=self.log_group)
                print(f"deleted log group {self.log_group}")
            else:
                print(f"log group {self.log_group} is not deploy.py's: left as it is")
        try:
            tags = tags_of(self.iam.list_role_tags(RoleName=self.role_name))
        except ClientError as error:
            if code(error) != "NoSuchEntity":
                raise
            print(f"no role {self.role_name}")
            return
        self.mine(f"role {self.role_name}", tags)
        # A role is deleted only once nothing is attached to it.
        attached = self.iam.list_attached_role_policies(RoleName=self.role_name)["AttachedPolicies"]
        for policy in attached:
            self.iam.detach_role_policy(RoleName=self.role_name, PolicyArn=policy["PolicyArn"])
        for inline in self.iam.list_role_policies(RoleName=self.role_name)["PolicyNames"]:
            self.iam.delete_role_policy(RoleName=self.role_name, PolicyName=inline)
        self.iam.delete_role(RoleName=self.role_name)
        print(f"deleted role {self.role_name}")

    @staticmethod
    def _gone(call: Any) -> None:
        try:
            call()
        except ClientError as error:
            if code(error) != "ResourceNotFoundException":
                raise


# -- the command ------------------------------------------------------------------------------


def timeout_s(budget_ms: int, grace_ms: int) -> int:
    """The function's timeout: the budget and the grace the server allows on top of it.
    The handler ends itself within the budget; the grace covers its start and its closing
    (flush, checkpoint). The server counts the invocation lost after both, so a longer
    timeout buys nothing, and a shorter one could kill a handler the server still trusts."""
    if budget_ms < 1000 or grace_ms < 0:
        raise Stop("--budget-ms is at least 1000 (as for the server) and --grace-ms at least 0")
    seconds = math.ceil((budget_ms + grace_ms) / 1000)
    if seconds > LAMBDA_TIMEOUT_S_MAX:
        raise Stop(
            f"--budget-ms {budget_ms} + --grace-ms {grace_ms} is over Lambda's {LAMBDA_TIMEOUT_S_MAX} s limit"
        )
    return seconds


def settings(args: argparse.Namespace, credentials: Credentials) -> dict[str, Any]:
    env = {
        "FUSEE_URL": credentials.address(args.server),
        "FUSEE_WORKFLOWS": args.workflows,
        "FUSEE_INVOKE_SECRET_FILE": f"{TASK_ROOT}/{CREDENTIALS_DIR}/invoke-secret",
    }
    if args.trace:
        env["FUSEE_INVOKE_TRACE"] = "1"
    return {
        "Runtime": args.runtime,
        "Handler": "handlers.aws_lambda.handler",
        "Timeout": timeout_s(args.budget_ms, args.grace_ms),
        "MemorySize": args.memory_mb,
        "Environment": {"Variables": env},
        "Description": f"fusee worker for {args.workflows} (examples/lambda/deploy.py)",
    }


def bytecode_wanted(args: argparse.Namespace) -> bool:
    """Bytecode is for one Python version: this one's, so only when it is the runtime's."""
    mine = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if args.bytecode and mine != args.runtime:
        raise Stop(f"--bytecode: this is {mine}; bytecode for {args.runtime} needs deploy.py run by it")
    return mine == args.runtime if args.bytecode is None else bool(args.bytecode)


def credentials_of(args: argparse.Namespace) -> Credentials:
    if args.server is None or args.secret_file is None:
        raise Stop("give --server HOST:PORT and --secret-file (or --teardown)")
    if "?" in args.server or "/" in args.server:
        raise Stop("--server is host:port only; --ca, --token-file, --cert and --key add the options")
    if (args.cert is None) != (args.key is None):
        raise Stop("--cert and --key go together")
    found = Credentials(args.secret_file, args.token_file, args.ca, args.cert, args.key)
    for name, path in found.files().items():
        if not path.is_file():
            raise Stop(f"{path} ({name}): no such file")
    try:  # the rules the server and the handler read them by (fusee/_secrets.py)
        _secrets.load(args.secret_file, "--secret-file")
        if args.token_file is not None:
            _secrets.load(args.token_file, "--token-file")
    except _secrets.SecretError as error:
        raise Stop(str(error)) from None
    return found


def function_lines(fn_settings: dict[str, Any]) -> str:
    """--build-only: what a function running the zip needs, for whoever deploys it (the
    environment holds paths inside the zip, no credential)."""
    env = fn_settings["Environment"]["Variables"]
    return "\n".join(
        [
            f"The function: handler {fn_settings['Handler']}, runtime {fn_settings['Runtime']}, "
            f"timeout {fn_settings['Timeout']} s, memory {fn_settings['MemorySize']} MB, environment:",
            *(f"  {name}={value}" for name, value in env.items()),
        ]
    )


def check_workflows(app: Path, workflows: str) -> None:
    """FUSEE_WORKFLOWS' modules imported from `app` as the function imports them
    (`handlers.import_workflows`, in a process of its own, `app` first on the path), before
    anything is built: the zip holds the `.py` files at the top of `app`, so each module
    must be one of them (a module found elsewhere on this machine is not in the zip)."""
    if not app.is_dir():
        raise Stop(f"--app {app}: no such directory")
    names = [name.strip() for name in workflows.split(",") if name.strip()]
    if not names:
        raise Stop("--workflows: name the module(s) of --app that define the workflows")
    for name in names:
        if not (app / f"{name}.py").is_file():
            raise Stop(
                f"--workflows {name}: no {name}.py in --app {app} (the zip holds the modules at the "
                "top of --app, and the function imports them from there)"
            )
    code = (
        "import sys, handlers\n"
        "try:\n    handlers.import_workflows(sys.argv[1])\n"
        "except handlers.SettingError as error:\n    sys.exit(str(error))\n"
    )
    # The app first, then this checkout (fusee and handlers, when they are not installed).
    path = os.pathsep.join([str(app.resolve()), str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code, ",".join(names)],
        cwd=app,
        env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise Stop(
            f"--workflows {workflows} (from --app {app}): {lines[-1] if lines else 'the import failed'}"
        )


def server_lines(args: argparse.Namespace, url: str | None, arn: str) -> str:
    """The `fusee server` command lines to run: with the function URL, and with direct
    invoke; listening as the function connects (TLS only with --ca, a token only with
    --token-file), or the function would be refused at every invocation."""
    port = args.server.rpartition(":")[2]
    common = ["fusee server --dir DATA_DIR", f"--listen 0.0.0.0:{port}"]
    if args.ca is not None:
        common[-1] += " --tls-cert SERVER_CERT.pem --tls-key SERVER_KEY.pem"
    if args.token_file is not None:
        common.append(f"--token-file {args.token_file}")
    tail = f"--invoke-secret-file {args.secret_file} --invoke-budget-ms {args.budget_ms}"
    blocks = []
    if url is not None:
        command = " \\\n    ".join([*common, f"--invoke {url}", tail])
        blocks.append(f"Run the server with (signed POSTs to the function URL):\n\n{command}")
    command = " \\\n    ".join(
        [*common, f"--invoke lambda:{args.name} --invoke-region {args.region_used}", tail]
    )
    blocks.append(
        "Or with direct invoke (no URL needed; the server's AWS credentials need "
        f"lambda:InvokeFunction on {arn}):\n\n{command}"
    )
    if args.grace_ms != 30_000:
        blocks.append(f'(--grace-ms {args.grace_ms}: give the server the same "graceMs" in --invoke-config)')
    if args.ca is None:
        blocks.append(
            "(The function connects without TLS, as built without --ca: its worker connection, "
            "token included, crosses the internet in the clear. Give --ca to turn TLS on.)"
        )
    return "\n\n".join(blocks)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--name", default="fusee-orders", help="the function's name; the role is NAME-role")
    p.add_argument("--region", help="the AWS region (default: AWS_REGION or the profile's)")
    p.add_argument("--endpoint-url", help="another AWS endpoint (tests; AWS_ENDPOINT_URL works too)")
    p.add_argument("--teardown", action="store_true", help="delete what deploy.py made, and stop")
    p.add_argument("--build-only", action="store_true", help="build the zip (see --zip), touch no AWS")
    p.add_argument("--zip", type=Path, help="also write the zip here (it holds the credentials: mode 600)")
    where = p.add_argument_group("the server, as the function reaches it")
    where.add_argument("--server", help="HOST:PORT")
    where.add_argument("--secret-file", type=Path, help="the server's --invoke-secret-file")
    where.add_argument("--token-file", type=Path, help="the token the server requires (its --token-file)")
    where.add_argument("--ca", help="the CA file of the server's certificate, or 'system' for public CAs")
    where.add_argument("--cert", type=Path, help="a client certificate (mutual TLS)")
    where.add_argument("--key", type=Path, help="its key")
    fn = p.add_argument_group("the function")
    fn.add_argument("--app", type=Path, default=APP_DIR, help="the directory of the app's modules")
    fn.add_argument("--workflows", default="orders", help="FUSEE_WORKFLOWS: the modules to import")
    fn.add_argument("--runtime", choices=sorted(RUNTIMES), default="python3.11")
    fn.add_argument("--arch", choices=sorted(PLATFORMS), default="x86_64")
    fn.add_argument(
        "--memory-mb", type=int, default=512, help="also the CPU share: Lambda scales it with memory"
    )
    fn.add_argument("--budget-ms", type=int, default=60_000, help="the server's --invoke-budget-ms")
    fn.add_argument("--grace-ms", type=int, default=30_000, help="the server's graceMs for the endpoint")
    fn.add_argument("--log-retention-days", type=int, default=14)
    fn.add_argument(
        "--trace", action=argparse.BooleanOptionalAction, default=True, help="FUSEE_INVOKE_TRACE=1"
    )
    fn.add_argument(
        "--bytecode",
        action=argparse.BooleanOptionalAction,
        help="ship .pyc files, for faster cold starts (default: when this Python is the runtime's)",
    )
    fn.add_argument("--no-url", action="store_true", help="no function URL: direct invoke only")
    p.add_argument("--cache-dir", type=Path, help="where wheels are kept (default ~/.cache/fusee-lambda)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.app_tag = args.app.resolve().name  # "orders"
    try:
        if args.teardown:
            Deployment(args).teardown()
            return 0
        credentials = credentials_of(args)
        fn_settings = settings(args, credentials)
        check_workflows(args.app, args.workflows)
        cache = (
            args.cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fusee-lambda"
        )
        cache.mkdir(parents=True, exist_ok=True)
        bytecode = bytecode_wanted(args)
        zipped = build_zip(args.app, credentials, cache, args.runtime, args.arch, bytecode)
        print(
            f"zip: {len(zipped):,} bytes ({len(zipped) / 2**20:.1f} MiB) for {args.runtime} on {args.arch}, "
            + (
                "with bytecode"
                if bytecode
                else f"without bytecode (run deploy.py with {args.runtime} to add it)"
            )
        )
        if args.zip is not None:
            write_private(args.zip, zipped)
        if args.build_only:
            print(function_lines(fn_settings))
            return 0
        aws = Deployment(args)
        args.region_used = aws.region
        role = aws.role()
        aws.logs_kept(args.log_retention_days)
        aws.function(zipped, role, fn_settings, args.arch)
        url: str | None = None
        if args.no_url:
            aws.no_url()
        else:
            url = aws.url()
            print(f"function URL: {url}")
        print()
        print(server_lines(args, url, aws.arn()))
    except Stop as stop:
        print(f"deploy.py: {stop}", file=sys.stderr)
        return 2
    except (ClientError, BotoCoreError) as error:  # AWS's own words are the useful ones
        print(f"deploy.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
