"""`handlers.aws_lambda.handler`: the invocation handler for AWS Lambda (function URL,
API Gateway v1 and v2, ALB), configured by the environment (see handlers/__init__.py).
Needs `pip install 'fusee[lambda]'` (mangum)."""

import mangum  # noqa: F401  loaded during the function's init, not on its first request

from handlers import from_environment

handler = from_environment().lambda_handler
