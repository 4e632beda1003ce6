"""`fusee server --invoke lambda:FUNCTION`: how the option is read, how the handler takes a
malformed direct event, and end to end, every part a real process on loopback: moto's
server as the Lambda service (tests/invoke/moto_lambda.py: its Invoke runs
`handlers.aws_lambda.handler` in-process), the server calling that Invoke API through boto3
(found through AWS_ENDPOINT_URL, as on a developer's machine), and a client. AWS is the
only thing faked; nothing of ours is. (The handler's answers to direct events, signed or
not, are in the entry-point tests: `lambda:direct` and `awslambdaric:direct`.)"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest
from fusee_server import endpoints as endpoint_settings
from fusee_server import lambda_client
from fusee_server.lambda_client import Target

import fusee
from fusee import journal as R
from fusee._errors import SettingError
from fusee.invoke import InvocationHandler
from tests.support.cluster import LEASE_LINES, Cluster, held_by_nobody, metrics, quiet, sends
from tests.support.handlers import AWS, FUNCTION, REGION, Listener, in_thread, published_vector
from tests.support.procs import ROOT, Proc, Server, free_port
from tests.support.server_cli import endpoints
from tests.support.waiting import eventually

SECRET = "lambda-direct-secret-0123456789abcdef"
ARN = f"arn:aws:lambda:eu-west-1:123456789012:function:{FUNCTION}"


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (f"lambda:{FUNCTION}", Target(FUNCTION, None, None)),
        (f"lambda:{FUNCTION}:live", Target(FUNCTION, "live", None)),
        (f"lambda:{FUNCTION}:$LATEST", Target(FUNCTION, "$LATEST", None)),
        (f"lambda:{ARN}", Target(ARN, None, "eu-west-1")),
        (f"lambda:{ARN}:7", Target(ARN, "7", "eu-west-1")),
        (
            "lambda:arn:aws-cn:lambda:cn-north-1:123456789012:function:f",
            Target("arn:aws-cn:lambda:cn-north-1:123456789012:function:f", None, "cn-north-1"),
        ),
        (
            f"lambda:123456789012:function:{FUNCTION}:live",
            Target(f"123456789012:function:{FUNCTION}", "live", None),
        ),
    ],
)
def test_a_lambda_target_is_a_name_or_an_arn_and_a_qualifier(url: str, target: Target) -> None:
    assert lambda_client.parse(url) == target


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("lambda:", "expected lambda:NAME"),
        ("lambda:my function", "expected lambda:NAME"),
        (f"lambda:{'f' * 65}", "expected lambda:NAME"),
        (f"lambda:{FUNCTION}:live:again", "'live:again' is not a qualifier"),
        (f"lambda:{FUNCTION}:", "'' is not a qualifier"),
        ("lambda:arn:aws:lambda:eu-west-1:123456789012:layer:x", "expected lambda:arn:aws:lambda:REGION"),
        ("lambda:arn:aws:lambda:eu-west-1:1234:function:x", "expected lambda:arn:aws:lambda:REGION"),
        ("lambda:1234:function:x", "expected lambda:ACCOUNT:function:NAME"),
    ],
)
def test_a_wrong_lambda_target_says_what_is_expected(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        lambda_client.parse(url)


def test_the_documented_event_is_what_the_server_sends() -> None:
    """docs/invoke.md's `lambda-event` block, byte for byte, for the test vector's request."""
    vector = published_vector()
    text = (ROOT / "docs" / "invoke.md").read_text()
    block = re.search(r"```json lambda-event\n(.*?)\n```", text, re.S)
    assert block, "docs/invoke.md has no ```json lambda-event block"
    headers = {"content-type": "application/json", "fusee-signature": vector["header"].split(": ", 1)[1]}
    assert lambda_client.event(headers, vector["body"].encode()).decode() == block.group(1)


def test_the_region_comes_from_the_option_the_arn_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert (
        endpoints("--invoke", f"lambda:{FUNCTION}", "--invoke-region", "us-west-2")[0].region == "us-west-2"
    )
    assert endpoints("--invoke", f"lambda:{ARN}")[0].region == "eu-west-1"
    assert endpoints("--invoke", f"lambda:{FUNCTION}")[0].region == "ap-south-1"
    config = tmp_path / "invoke.json"
    config.write_text(json.dumps({"endpoints": [{"url": f"lambda:{FUNCTION}:live", "region": "eu-north-1"}]}))
    found = endpoints("--invoke-config", str(config))[0]
    assert (found.url, found.region) == (f"lambda:{FUNCTION}:live", "eu-north-1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--invoke", f"lambda:{ARN}", "--invoke-region", "us-east-1"],
            f"--invoke lambda:{ARN}: --invoke-region us-east-1 but the function's ARN is in eu-west-1",
        ),
        (
            ["--invoke", "http://127.0.0.1:9/", "--invoke-region", "us-east-1"],
            "--invoke http://127.0.0.1:9/: --invoke-region is for lambda: endpoints",
        ),
        (
            ["--invoke", f"lambda:{FUNCTION}", "--invoke-ca", "ca.pem"],
            f"--invoke lambda:{FUNCTION}: --invoke-ca/--invoke-cert need an https:// URL",
        ),
        (["--invoke", "lambda:a b"], "--invoke lambda:a b: expected lambda:NAME[:QUALIFIER]"),
    ],
)
def test_a_wrong_lambda_setting_stops_the_start_naming_it(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    with pytest.raises(SettingError) as raised:
        endpoints(*argv)
    assert str(raised.value).startswith(message), raised.value


def test_no_region_anywhere_names_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(SettingError, match="no AWS region: give --invoke-region"):
        endpoints("--invoke", f"lambda:{FUNCTION}")


def test_without_boto3_a_lambda_endpoint_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import boto3` does when it is not installed
    with pytest.raises(SettingError) as raised:
        endpoints("--invoke", f"lambda:{FUNCTION}")
    assert str(raised.value) == (
        f"--invoke lambda:{FUNCTION}: invoking Lambda directly needs boto3: pip install 'fusee-server[lambda]'"
    )
    config = tmp_path / "invoke.json"
    config.write_text(json.dumps({"endpoints": [{"url": f"lambda:{FUNCTION}", "regoin": "eu-west-1"}]}))
    with pytest.raises(SettingError, match="regoin"):  # unknown keys are still refused
        endpoints("--invoke-config", str(config))


@pytest.mark.parametrize(
    "request_",
    [
        1,
        {"headers": {}},
        {"headers": {}, "body": 5},
        {"headers": [], "body": "{}"},
        {"headers": {"fusee-signature": 5}, "body": "{}"},
        {"headers": {}, "body": '{"é": 1}'},
    ],
)
def test_a_malformed_direct_event_is_400_and_connects_to_nothing(
    handler: InvocationHandler, listener: Listener, request_: Any
) -> None:
    mark = listener.mark()
    answer = in_thread(lambda: handler.lambda_handler({"fusee": request_}, None))
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"]) == {
        "error": "a direct invocation is " + ('{"fusee": {"headers": {name: value}, "body": "<JSON text>"}}')
    }
    assert listener.settled() == mark


async def test_no_connection_to_the_invoke_api_is_no_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    transport = lambda_client.LambdaTransport(
        endpoint_settings.Endpoint(url=f"lambda:{FUNCTION}", region=REGION, concurrency=2)
    )
    try:
        with caplog.at_level(logging.INFO, "fusee.invoker"):
            assert (await transport.send({"content-type": "application/json"}, b"{}")).status == 0
    finally:
        transport.close()
    assert "Could not connect to the endpoint URL" in caplog.text


class MotoLambda(Proc):
    def __init__(self, control: Path) -> None:
        super().__init__([sys.executable, "-m", "tests.invoke.moto_lambda", str(control)])
        self.url = "http://" + self.wait_for(r"moto lambda on (127\.0\.0\.1:\d+)").group(1)


class Cloud:
    """The Lambda service with one function whose handler serves the server on `port`;
    `faults` injects faults (see moto_lambda.py). The AWS settings are in the test's
    environment, so the processes it starts (the server: boto3 finds moto through
    AWS_ENDPOINT_URL) and its own boto3 clients have them."""

    def __init__(self, procs: list[Proc], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, value in AWS.items():
            monkeypatch.setenv(name, value)
        self.procs = procs
        self.tmp = tmp
        self.cluster: Cluster[Proc] = Cluster(tmp, procs=procs, secret=SECRET)  # the server's side
        self.secret = self.cluster.secret
        self.control = tmp / "faults.json"
        self.moto = MotoLambda(self.control)
        procs.append(self.moto)
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.moto.url)
        iam = boto3.client("iam")
        role = iam.create_role(RoleName="fusee-worker", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as archive:
            archive.writestr("README", "moto runs handlers.aws_lambda from the checkout")
        self.arn: str = boto3.client("lambda").create_function(
            FunctionName=FUNCTION,
            Runtime="python3.11",
            Role=role,
            Handler="handlers.aws_lambda.handler",
            Code={"ZipFile": code.getvalue()},
            Timeout=30,
            Environment={
                "Variables": {
                    "FUSEE_URL": self.cluster.host_port,
                    "FUSEE_INVOKE_SECRET": SECRET,
                    "FUSEE_WORKFLOWS": "tests.server_mode.flows",
                    "FUSEE_INVOKE_TRACE": "1",
                }
            },
        )["FunctionArn"]
        self.server: Server | None = None

    def faults(self, **counts: Any) -> None:
        scratch = self.control.with_suffix(".tmp")
        scratch.write_text(json.dumps(counts))
        scratch.replace(self.control)

    def start_server(self, target: str | None, *extra: str) -> Server:
        """`fusee server --invoke target` (with the secret, and a budget under the function's
        30 s timeout), or with `extra` options alone when `target` is None."""
        args: list[str] = []
        if target is not None:
            args = [
                "--invoke",
                target,
                "--invoke-secret-file",
                str(self.secret),
                "--invoke-budget-ms",
                "20000",
            ]
        # Its trace (FUSEE_INVOKE_TRACE=1) says why it sent each invocation (`sends`).
        self.server = self.cluster.start_server(*args, *LEASE_LINES, *extra, env={"FUSEE_INVOKE_TRACE": "1"})
        return self.server

    async def client(self) -> fusee.Client:
        return await self.cluster.client()


@pytest.fixture
def cloud(procs: list[Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    return Cloud(procs, tmp_path, monkeypatch)


async def endpoint(client: fusee.Client) -> dict[str, Any]:
    found: dict[str, Any] = (await metrics(client))["endpoints"][0]
    return found


async def test_workflows_run_on_the_function_and_a_sleep_invokes_it_again(cloud: Cloud) -> None:
    server = cloud.start_server(f"lambda:{FUNCTION}", "--invoke-region", REGION)
    client = await cloud.client()
    await quiet(client)  # the start's invocation of every shard, done
    runs = [await client.start("steps", f"direct-{i}", 3) for i in range(8)]
    nap = await client.start("sleeper", "nap", 1.5)
    assert [len(await run.result()) for run in runs] == [3] * 8
    await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)  # nothing runs while it sleeps
    woke = await nap.result()
    # Woken by an invocation for its timer, not before the due time its journal recorded
    # (orderings: how late it wakes is the benchmark's figure, not a test's bound).
    due_ms = next(rec.due for rec in (await nap.describe()).journal if isinstance(rec, R.TimerStarted))
    assert woke * 1000 >= due_ms, (woke, due_ms)
    assert any(
        "timer" in reasons and client.shard_of("nap") in shards for _, shards, reasons in sends(server)
    )
    after = (await quiet(client))["endpoints"][0]  # the sleeper's invocation answered
    assert after["url"] == f"lambda:{FUNCTION}"
    assert after["succeeded"] >= 5 and after["failed"] == after["throttled"] == after["timedOut"] == 0, after
    assert after["steps"] >= 25  # 8 runs of 3 and the sleeper's one step, all run by the function
    await client.close()


async def test_a_throttle_and_a_function_error_show_in_the_metrics_and_the_work_finishes(
    cloud: Cloud,
) -> None:
    # By ARN and qualifier this time. Lambda throttles the first two invocations (those
    # of the server's start), asking for two seconds' pause.
    cloud.faults(throttle=2, retryAfter="2")
    server = cloud.start_server(f"lambda:{cloud.arn}:$LATEST")
    client = await cloud.client()
    throttled = await eventually(lambda: _counted(client, "throttled", 2), timeout=30.0, every=0.05)
    server.wait_for(
        r"lambda:arn:aws:lambda:us-east-1:\d+:function:fusee-worker:\$LATEST throttled invocations \(429\)"
    )
    assert throttled["failed"] == 0 and throttled["concurrency"] == 4, throttled  # 16, halved twice
    assert throttled["backoffMs"] > 1000, throttled  # Lambda's Retry-After, not the default 1 s
    run = await client.start("steps", "after-throttle", 2)
    assert len(await run.result()) == 2
    # Then the function fails once (an unhandled error in it): the invoker backs off,
    # invokes again, and the workflow finishes.
    await quiet(client)
    cloud.faults(fail=1)
    run = await client.start("steps", "after-failure", 2)
    assert len(await run.result()) == 2
    after = await endpoint(client)
    assert after["failed"] == 1 and after["throttled"] == 2 and after["succeeded"] >= 3, after
    # As a function URL answers a function's failure.
    server.wait_for(
        r"to lambda:arn:\S+ failed: 502: the function failed \(Unhandled; its log has the error\)"
    )
    await client.close()


async def _counted(client: fusee.Client, key: str, least: int) -> dict[str, Any] | None:
    now = await endpoint(client)
    return now if now[key] >= least else None


async def test_a_function_slower_than_budget_and_grace_times_out_and_the_work_finishes(
    cloud: Cloud,
) -> None:
    # The first invocation (of the server's start) answers after 3 s; the server waits
    # 1.5 s (its budget and grace, from the config file, the region with them).
    cloud.faults(hang=1, hangS=3)
    config = cloud.tmp / "invoke.json"
    endpoint_config = {
        "url": f"lambda:{FUNCTION}",
        "region": REGION,
        "secretFile": str(cloud.secret),
        "budgetMs": 1000,
        "graceMs": 500,
    }
    config.write_text(json.dumps({"endpoints": [endpoint_config]}))
    server = cloud.start_server(None, "--invoke-config", str(config))
    client = await cloud.client()
    timed_out = await eventually(lambda: _counted(client, "timedOut", 1), timeout=30.0, every=0.05)
    assert timed_out["failed"] == timed_out["throttled"] == 0, timed_out
    server.wait_for(
        r"to lambda:fusee-worker failed: no answer within the budget and the grace \(1000 \+ 500 ms\)"
    )
    run = await client.start("steps", "after-timeout", 2)
    assert len(await run.result()) == 2
    assert (await endpoint(client))["timedOut"] == 1
    await client.close()
