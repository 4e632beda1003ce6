"""`GET /v1/runs/{id}/streams/{name}` (docs/http-api.md, *Streams*): durable chunks from
an offset as JSON batches (a long poll), and as server-sent events with
`Accept: text/event-stream`, resumed from `Last-Event-ID`. A real server with `--http`
and a worker process."""

from __future__ import annotations

import aiohttp

from tests.support.http import Http
from tests.support.server_cli import base_url

CHUNKS = 25


def _events(text: str) -> list[tuple[str, str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((fields["event"], fields["id"], fields["data"]))
    return out


async def test_a_stream_read_over_http_as_batches_and_as_events(start_server, start_worker):
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address())
    url = base_url(server)
    async with Http(url) as api:
        status, _ = await api.post("/v1/runs", {"type": "streamer", "id": "h-1", "input": CHUNKS})
        assert status == 201
        got: list[int] = []
        offset, end = 0, None
        while end is None:
            status, batch = await api.get(
                "/v1/runs/h-1/streams/numbers", **{"from": str(offset), "wait": "10000"}
            )
            assert status == 200, batch
            assert batch["from"] == offset and batch["next"] == offset + len(batch["chunks"])
            got += batch["chunks"]
            offset, end = batch["next"], batch.get("end")
        assert got == list(range(CHUNKS)) and end == {"status": "ok", "closed": True}

        status, error = await api.get("/v1/runs/nobody/streams/numbers", wait="0")
        assert status == 404 and error["code"] == "NotFound"
        status, error = await api.get("/v1/runs/h-1/streams/numbers", wait="99999999")
        assert status == 400

    async with aiohttp.ClientSession() as session:
        headers = {"Accept": "text/event-stream"}
        async with session.get(f"{url}/v1/runs/h-1/streams/numbers", headers=headers) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events = _events(await response.text())
        assert [int(data) for kind, _, data in events if kind == "chunk"] == list(range(CHUNKS))
        assert [int(i) for kind, i, _ in events if kind == "chunk"] == list(range(1, CHUNKS + 1))
        assert events[-1][0] == "end" and '"closed":true' in events[-1][2]
        # A reconnecting EventSource sends the last id it saw: the rest, once.
        async with session.get(
            f"{url}/v1/runs/h-1/streams/numbers", headers={**headers, "Last-Event-ID": "20"}
        ) as response:
            events = _events(await response.text())
        assert [int(data) for kind, _, data in events if kind == "chunk"] == list(range(20, CHUNKS))
