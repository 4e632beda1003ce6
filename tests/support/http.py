"""A plain HTTP client of the server's `/v1` API, for tests and bench/http_api.py: aiohttp
and JSON only, nothing of fusee on the request's path (what a webhook from another
language would do)."""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import quote

import aiohttp


def path_id(id: str) -> str:
    """A workflow ID as one path segment (a '/' in it percent-encoded)."""
    return quote(id, safe="")


class Http:
    """Requests against `base` (http://host:port) with `token` as the bearer, if any."""

    def __init__(self, base: str, token: str | None = None) -> None:
        self.base = base
        self.token = token
        self.session = aiohttp.ClientSession()

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> Http:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        token: str | bool | None = True,
    ) -> tuple[int, Any]:
        """(status, the answer's JSON). `body` is sent as JSON (Content-Type set); `data`
        as raw bytes with only `headers`. `token`: True for this client's, or another."""
        sent = dict(headers or {})
        bearer = self.token if token is True else token or None
        if bearer is not None:
            sent.setdefault("Authorization", f"Bearer {bearer}")
        if data is None and body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        # A large body as a stream: aiohttp warns that raw bytes would hold the loop.
        payload = io.BytesIO(data) if data is not None and len(data) > 1 << 20 else data
        async with self.session.request(
            method, self.base + path, data=payload, params=params, headers=sent
        ) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any = None, **options: Any) -> tuple[int, Any]:
        if body is None and "data" not in options:
            options.setdefault("headers", {}).setdefault("X-Fusee-Action", "1")
        return await self.request("POST", path, body, **options)

    async def ok(self, method: str, path: str, body: Any = None, **params: str) -> Any:
        """The answer of a request that must succeed (200 or 201)."""
        if method == "GET":
            status, answer = await self.get(path, **params)
        else:
            status, answer = await self.post(path, body)
        assert status in (200, 201), (method, path, status, answer)
        return answer
