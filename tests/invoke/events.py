"""AWS Lambda events for an HTTP POST, shaped as AWS documents them:

- function URL: "Invoking Lambda function URLs", request payload (format 2.0);
- API Gateway HTTP API: "Working with AWS Lambda proxy integrations for HTTP APIs",
  payload format version 2.0;
- API Gateway REST API: "Input format of a Lambda function for proxy integration" (1.0);
- Application Load Balancer: "Lambda functions as targets", with and without
  multi-value headers;
- a direct invocation, as `fusee server --invoke lambda:FUNCTION` sends it through the
  Invoke API (docs/invoke.md, *Direct Lambda invoke*).

Function URLs lowercase header names; REST APIs pass them as the client sent them. A body
arrives as text, or base64 with `isBase64Encoded` (what Lambda does for a body it does
not take for text).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from fusee_server import lambda_client

ACCOUNT = "123456789012"
SOURCE_IP = "198.51.100.7"
USER_AGENT = "fusee-invoker"


def _body(body: bytes, b64: bool) -> str:
    return base64.b64encode(body).decode() if b64 else body.decode()


def function_url(headers: dict[str, str], body: bytes, b64: bool = False) -> dict[str, Any]:
    domain = "abcdefghijkl.lambda-url.eu-west-1.on.aws"
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "content-length": str(len(body)),
            "host": domain,
            "user-agent": USER_AGENT,
            "x-amzn-trace-id": "Root=1-5eb1c2d3-0123456789abcdef01234567",
            "x-forwarded-for": SOURCE_IP,
            "x-forwarded-port": "443",
            "x-forwarded-proto": "https",
            **{name.lower(): value for name, value in headers.items()},
        },
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "abcdefghijkl",
            "domainName": domain,
            "domainPrefix": "abcdefghijkl",
            "http": {
                "method": "POST",
                "path": "/",
                "protocol": "HTTP/1.1",
                "sourceIp": SOURCE_IP,
                "userAgent": USER_AGENT,
            },
            "requestId": "c3e1e2a4-9f8b-4c1d-8f00-000000000001",
            "routeKey": "$default",
            "stage": "$default",
            "time": "30/Nov/2026:08:00:00 +0000",
            "timeEpoch": 1796025600000,
        },
        "body": _body(body, b64),
        "isBase64Encoded": b64,
    }


def http_api_v2(headers: dict[str, str], body: bytes, b64: bool = False) -> dict[str, Any]:
    domain = "r3pmxmplak.execute-api.eu-west-1.amazonaws.com"
    return {
        "version": "2.0",
        "routeKey": "POST /invoke",
        "rawPath": "/invoke",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "content-length": str(len(body)),
            "host": domain,
            "user-agent": USER_AGENT,
            "x-amzn-trace-id": "Root=1-5eb1c2d3-0123456789abcdef01234567",
            "x-forwarded-for": SOURCE_IP,
            "x-forwarded-port": "443",
            "x-forwarded-proto": "https",
            **{name.lower(): value for name, value in headers.items()},
        },
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "r3pmxmplak",
            "domainName": domain,
            "domainPrefix": "r3pmxmplak",
            "http": {
                "method": "POST",
                "path": "/invoke",
                "protocol": "HTTP/1.1",
                "sourceIp": SOURCE_IP,
                "userAgent": USER_AGENT,
            },
            "requestId": "JKJaXmPLvHcESHA=",
            "routeKey": "POST /invoke",
            "stage": "$default",
            "time": "30/Nov/2026:08:00:00 +0000",
            "timeEpoch": 1796025600000,
        },
        "body": _body(body, b64),
        "isBase64Encoded": b64,
    }


def rest_api_v1(headers: dict[str, str], body: bytes, b64: bool = False) -> dict[str, Any]:
    domain = "r3pmxmplak.execute-api.eu-west-1.amazonaws.com"
    sent = {
        "Content-Type": "application/json",
        "Host": domain,
        "User-Agent": USER_AGENT,
        "X-Amzn-Trace-Id": "Root=1-5eb1c2d3-0123456789abcdef01234567",
        "X-Forwarded-For": SOURCE_IP,
        "X-Forwarded-Port": "443",
        "X-Forwarded-Proto": "https",
        **headers,  # as the client wrote them
    }
    return {
        "resource": "/invoke",
        "path": "/invoke",
        "httpMethod": "POST",
        "headers": sent,
        "multiValueHeaders": {name: [value] for name, value in sent.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "r3pmxmplak",
            "domainName": domain,
            "extendedRequestId": "JKJaXmPLvHcESHA=",
            "httpMethod": "POST",
            "identity": {"sourceIp": SOURCE_IP, "userAgent": USER_AGENT},
            "path": "/prod/invoke",
            "protocol": "HTTP/1.1",
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "requestTime": "30/Nov/2026:08:00:00 +0000",
            "requestTimeEpoch": 1796025600000,
            "resourceId": "123456",
            "resourcePath": "/invoke",
            "stage": "prod",
        },
        "body": _body(body, b64),
        "isBase64Encoded": b64,
    }


def alb(headers: dict[str, str], body: bytes, b64: bool = False, multi_value: bool = False) -> dict[str, Any]:
    sent = {
        "content-type": "application/json",
        "host": "fusee-worker-123456789.eu-west-1.elb.amazonaws.com",
        "user-agent": USER_AGENT,
        "x-amzn-trace-id": "Root=1-5eb1c2d3-0123456789abcdef01234567",
        "x-forwarded-for": SOURCE_IP,
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
        **{name.lower(): value for name, value in headers.items()},
    }
    event: dict[str, Any] = {
        "requestContext": {
            "elb": {
                "targetGroupArn": (
                    f"arn:aws:elasticloadbalancing:eu-west-1:{ACCOUNT}:targetgroup/fusee-worker/6d0ecf831eec9f09"
                )
            }
        },
        "httpMethod": "POST",
        "path": "/invoke",
        "body": _body(body, b64),
        "isBase64Encoded": b64,
    }
    if multi_value:
        event["multiValueQueryStringParameters"] = {}
        event["multiValueHeaders"] = {name: [value] for name, value in sent.items()}
    else:
        event["queryStringParameters"] = {}
        event["headers"] = sent
    return event


def direct(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The server's own encoding, as the Lambda runtime hands it to the handler: parsed."""
    event: dict[str, Any] = json.loads(lambda_client.event(headers, body))
    return event


SHAPES: dict[str, Callable[[dict[str, str], bytes], dict[str, Any]]] = {
    "function-url": lambda h, b: function_url(h, b),
    "function-url-base64": lambda h, b: function_url(h, b, b64=True),
    "http-api-v2": lambda h, b: http_api_v2(h, b),
    "http-api-v2-base64": lambda h, b: http_api_v2(h, b, b64=True),
    "rest-api-v1": lambda h, b: rest_api_v1(h, b),
    "rest-api-v1-base64": lambda h, b: rest_api_v1(h, b, b64=True),
    "alb": lambda h, b: alb(h, b),
    "alb-multi-value-base64": lambda h, b: alb(h, b, b64=True, multi_value=True),
    "direct": direct,
}


def response(answer: dict[str, Any]) -> tuple[int, bytes]:
    """The status and body bytes of a Lambda proxy response."""
    body = answer.get("body") or ""
    data = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode()
    return int(answer["statusCode"]), data
