"""Direct AWS Lambda invocations: `--invoke lambda:FUNCTION[:QUALIFIER]` calls the Lambda
Invoke API instead of POSTing to a URL, so a function needs no function URL, API Gateway
or ALB in front of it, and IAM (`lambda:InvokeFunction`) decides who may run it.

The request is the HTTP one inside a JSON event, signed the same way (docs/invoke.md,
*Direct Lambda invoke*):

    {"fusee":{"headers":{"content-type":"application/json","fusee-signature":"t=…,v1=…"},"body":"<the body>"}}

and the handler answers `{"statusCode": …, "headers": {…}, "body": "…"}`, the shape a
function URL turns into an HTTP answer. `LambdaTransport.send` gives the invoker what an
HTTP endpoint would have (an `Answer`): a status (the handler's, 429 for Lambda's
throttles, 502 for a function error, as a function URL would answer), a Retry-After and
why, so the outcome is decided in one place for both kinds of endpoint. botocore follows
no redirect (its urllib3 requests are made with `Retry(False)`): a 3xx from the Invoke
API's URL is a failed answer, and the signed event goes nowhere else.

boto3 is imported only when such an endpoint is configured (`fusee-server[lambda]`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from fusee_server.invoke_answer import Answer

logger = logging.getLogger("fusee.invoker")

PREFIX = "lambda:"
# Lambda's own throttles: its concurrency (TooManyRequestsException, 429) and EC2's while
# it creates a function's network interfaces (502). Both pass; the invoker lowers the
# endpoint's concurrency instead of backing off as for a broken function.
THROTTLES = frozenset({"TooManyRequestsException", "EC2ThrottledException"})
CONNECT_TIMEOUT_S = 5
# The invoker stops waiting at the budget plus the grace; botocore's read gives up a
# moment later, so the pool's thread comes back instead of hanging on a dead socket.
READ_MARGIN_S = 2
FUNCTION_ERROR_STATUS = 502  # what a function URL answers when the function fails

_NAME = r"[A-Za-z0-9_-]{1,64}"
_QUALIFIER = re.compile(r"[A-Za-z0-9$_-]{1,128}")
_ARN = re.compile(rf"arn:(aws[a-z-]*):lambda:([a-z0-9-]+):(\d{{12}}):function:({_NAME})")
_PARTIAL_ARN = re.compile(rf"\d{{12}}:function:{_NAME}")


@dataclass(frozen=True)
class Target:
    function: str  # a name, a partial ARN (ACCOUNT:function:NAME) or an ARN, unqualified
    qualifier: str | None  # a version or an alias
    region: str | None  # an ARN's


def is_lambda(url: str) -> bool:
    return url.startswith(PREFIX)


def parse(url: str) -> Target:
    """`lambda:FUNCTION[:QUALIFIER]`, FUNCTION a name or an ARN (which holds colons of its
    own: the qualifier is what follows its seventh part). ValueError says what is wrong."""
    rest = url.removeprefix(PREFIX)
    parts = rest.split(":")
    if parts[0] == "arn":
        head, qualifier = ":".join(parts[:7]), parts[7:]
        found = _ARN.fullmatch(head)
        if found is None:
            raise ValueError("expected lambda:arn:aws:lambda:REGION:ACCOUNT:function:NAME[:QUALIFIER]")
        region: str | None = found.group(2)
    elif len(parts) >= 3 and parts[1] == "function":
        head, qualifier = ":".join(parts[:3]), parts[3:]
        if _PARTIAL_ARN.fullmatch(head) is None:
            raise ValueError("expected lambda:ACCOUNT:function:NAME[:QUALIFIER]")
        region = None
    else:
        head, qualifier = parts[0], parts[1:]
        if re.fullmatch(_NAME, head) is None:
            raise ValueError(
                "expected lambda:NAME[:QUALIFIER] (a function name: letters, digits, - and _, "
                "at most 64) or lambda:ARN[:QUALIFIER]"
            )
        region = None
    if len(qualifier) > 1 or (qualifier and _QUALIFIER.fullmatch(qualifier[0]) is None):
        raise ValueError(f"{':'.join(qualifier)!r} is not a qualifier (a version or an alias)")
    return Target(head, qualifier[0] if qualifier else None, region)


def region(given: str | None, target: Target) -> str:
    """The region to call: `--invoke-region`, else the ARN's, else the AWS SDK's (AWS_REGION,
    AWS_DEFAULT_REGION, the profile's). ValueError when none, or when they disagree."""
    if given is not None and target.region is not None and given != target.region:
        raise ValueError(f"--invoke-region {given} but the function's ARN is in {target.region}")
    found = given or target.region
    if found is None:
        found = _boto3().session.Session().region_name
    if not found:
        raise ValueError("no AWS region: give --invoke-region (or set AWS_REGION)")
    return str(found)


def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise ValueError("invoking Lambda directly needs boto3: pip install 'fusee-server[lambda]'") from None
    return boto3


def event(headers: dict[str, str], body: bytes) -> bytes:
    """The Invoke payload: the signed request, its body as a string (ASCII JSON, so the
    handler gets back the very bytes the signature covers)."""
    return msgspec.json.encode({"fusee": {"headers": headers, "body": body.decode()}})


class _Answer(msgspec.Struct, rename="camel"):
    status_code: int  # `statusCode`, as in the answer a function URL turns into HTTP
    headers: dict[str, str] = {}
    body: Any = ""  # the handler's JSON text; only its start is kept, to say why it failed


class Settings(Protocol):
    """What the transport reads of its endpoint's settings (`endpoints.Endpoint`)."""

    @property
    def url(self) -> str: ...
    @property
    def region(self) -> str | None: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def budget_ms(self) -> int: ...
    @property
    def grace_ms(self) -> int: ...


class LambdaTransport:
    """Calls one function through the Invoke API, at most `concurrency` at a time: boto3 is
    synchronous, so each call holds a thread of a pool that size (and a pooled connection)
    for as long as the function runs, as an aiohttp request holds a slot."""

    def __init__(self, config: Settings) -> None:
        from botocore.config import Config

        self.target = parse(config.url)
        self.where = config.url
        self.timeout_s = (config.budget_ms + config.grace_ms) / 1000
        self.pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="fusee-lambda")
        # One attempt: the invoker decides about retries (a retried invoke would run the
        # invocation twice under one ID). The endpoint URL comes from AWS_ENDPOINT_URL_LAMBDA
        # or AWS_ENDPOINT_URL, which botocore reads itself, credentials from its usual chain.
        self.client = _boto3().client(
            "lambda",
            region_name=config.region,
            config=Config(
                retries={"total_max_attempts": 1},
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=self.timeout_s + READ_MARGIN_S,
                max_pool_connections=config.concurrency,
            ),
        )

    async def send(self, headers: dict[str, str], body: bytes) -> Answer:
        """What the call came to, as an HTTP endpoint answers (status 0: no answer);
        TimeoutError after the budget and the grace."""
        payload = event(headers, body)
        call = asyncio.get_running_loop().run_in_executor(self.pool, self._invoke, payload)
        return await asyncio.wait_for(call, self.timeout_s)

    def _invoke(self, payload: bytes) -> Answer:
        from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

        qualifier = {"Qualifier": self.target.qualifier} if self.target.qualifier else {}
        try:
            response = self.client.invoke(
                FunctionName=self.target.function,
                InvocationType="RequestResponse",
                Payload=payload,
                **qualifier,
            )
            data = response["Payload"].read()
        except ReadTimeoutError:
            raise TimeoutError(f"{self.where}: no answer within {self.timeout_s:.0f} s") from None
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            meta = error.response.get("ResponseMetadata", {})
            status = int(meta.get("HTTPStatusCode") or 0)
            headers = meta.get("HTTPHeaders", {})
            if code in THROTTLES or status == 429:
                return Answer(429, headers.get("retry-after"), str(error))
            logger.info("%s: %s", self.where, error)
            return Answer(status or 500, None, str(error), headers.get("location"))
        except BotoCoreError as error:  # no connection, no credentials, a broken answer
            logger.info("%s: %s", self.where, error)
            return Answer(0, None, str(error))
        if response.get("FunctionError"):
            logger.info("%s: function error (%s): %s", self.where, response["FunctionError"], data[:500])
            failed = f"the function failed ({response['FunctionError']}; its log has the error)"
            return Answer(FUNCTION_ERROR_STATUS, None, data[:500].decode(errors="replace"), meaning=failed)
        try:
            answer = msgspec.json.decode(data, type=_Answer)
        except msgspec.DecodeError as error:  # a function that is not a fusee handler
            logger.info("%s: not a handler's answer (%s): %s", self.where, error, data[:200])
            meaning = "the function's answer is not a fusee handler's"
            return Answer(FUNCTION_ERROR_STATUS, None, str(error), meaning=meaning)
        headers = {k.lower(): v for k, v in answer.headers.items()}
        return Answer(answer.status_code, headers.get("retry-after"), str(answer.body)[:500])

    def close(self) -> None:
        # Calls still running are not waited for: their invocations ended with the server.
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
