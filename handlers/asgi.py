"""`uvicorn handlers.asgi:app`: the invocation handler as an ASGI app, configured by the
environment (see handlers/__init__.py)."""

from handlers import from_environment

app = from_environment()
