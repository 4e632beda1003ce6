"""The worker side of invoked mode (docs/invoke.md): the request's signature, the
run until idle or until the budget, the IDLE reports, and the entry points (ASGI, AWS
Lambda, any framework through `invoke`). docs/invoke.md says how to deploy it."""

from fusee.invoke._entry_points import InvocationHandler, invocation_handler
from fusee.invoke._request import Invocation, ShardSummary, Summary

__all__ = ["Invocation", "InvocationHandler", "ShardSummary", "Summary", "invocation_handler"]
