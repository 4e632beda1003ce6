"""`handlers.aws_lambda.handler`: the invocation handler for AWS Lambda, invoked directly
by the server (`fusee server --invoke lambda:FUNCTION`) or behind a function URL, API
Gateway (v1, v2) or an ALB, configured by the environment (see handlers/__init__.py).
Needs `pip install 'fusee[lambda]'` (mangum)."""

import mangum  # noqa: F401  loaded during the function's init, not on its first request

from handlers import from_environment

handler = from_environment().lambda_handler
