"""What the HTTP API (`/v1`, docs/http-api.md) costs against the binary client. Run on
demand: `python bench/http_api.py [--rounds 7] [--runs 200] [--seconds 3] [--list-runs 10000]`
(not a timed test; about half a minute).

A `fusee server --http` on loopback and one worker process (tests/server_mode/worker.py,
4 shards); this process is the client. Prints:
- start -> result of a run with no step (`gather`), p50 and p90 over ROUNDS alternating
  rounds of RUNS each: the binary client (`client.start` then `run.result()`) against
  HTTP (`POST /v1/runs` then `GET /v1/runs/{id}/result`) on one kept-alive connection,
  and under them the floor of an HTTP round trip that reaches no worker (`GET /healthz`);
- requests per second of `GET /v1/runs/{id}` (the summary and the journal) and of
  `?journal=false` (the summary), with CONCURRENCY requests in flight for SECONDS, over
  as many kept-alive connections;
- with LIST_RUNS runs in the directory, a page of `GET /v1/runs?limit=50` (the first,
  and one in the middle by its cursor), p50 and p90;
- the web UI's pages (docs/web-ui.md) with those runs: the runs page (`GET /`, 50 a page,
  the first and one in the middle), and a run's page (`GET /runs/{id}`) of a run with no
  step and of one with 20 steps, p50 and p90.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from _server_procs import Child, run_in  # noqa: E402

import fusee  # noqa: E402 (after the path above)


class HttpServer(Child):
    """`fusee server` on loopback TCP with `--http` (any free ports)."""

    def __init__(self, dir: Path) -> None:
        args = [sys.executable, "-m", "fusee", "server", "--dir", str(dir), "--shards", "4"]
        super().__init__([*args, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        self.tcp = self.url = ""

    async def ready(self) -> HttpServer:
        self.tcp = (await self.wait_for_async(r"listening on (127\.0\.0\.1:\d+)")).group(1)
        self.url = (await self.wait_for_async(r"metrics on (http://\S+)/metrics")).group(1)
        await self.wait_for_async(r"ready$")
        return self


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.9)]


async def timed(n: int, one: Callable[[int], Awaitable[object]]) -> list[float]:
    """Milliseconds of each of `n` sequential calls."""
    out = []
    for i in range(n):
        began = time.perf_counter()
        await one(i)
        out.append((time.perf_counter() - began) * 1000)
    return out


async def start_to_result(
    args: argparse.Namespace, client: fusee.Client, http: aiohttp.ClientSession, url: str
) -> None:
    async def binary(tag: str, i: int) -> None:
        run = await client.start("gather", f"bin-{tag}-{i}", [i])
        assert await run.result() == [i]

    async def over_http(tag: str, i: int) -> None:
        async with http.post(
            f"{url}/v1/runs", json={"type": "gather", "id": f"http-{tag}-{i}", "input": [i]}
        ) as r:
            assert r.status == 201, await r.text()
        async with http.get(f"{url}/v1/runs/http-{tag}-{i}/result", params={"wait": "10000"}) as r:
            assert (await r.json())["result"] == [i]

    async def healthz(_: int) -> None:
        async with http.get(f"{url}/healthz") as r:
            await r.read()

    await timed(50, lambda i: binary("warm", i))
    await timed(50, lambda i: over_http("warm", i))
    samples: dict[str, list[float]] = {"binary": [], "http": [], "floor": []}
    for r in range(args.rounds):
        pair = [("binary", binary), ("http", over_http)]
        for name, one in pair if r % 2 == 0 else reversed(pair):
            samples[name] += await timed(args.runs, lambda i, one=one, r=r: one(str(r), i))  # type: ignore[misc]
        samples["floor"] += await timed(args.runs, healthz)
    print(f"start -> result of a run with no step, {args.rounds} rounds x {args.runs} runs (ms)")
    print(f"{'':28} {'p50':>8} {'p90':>8}")
    for name, label in (
        ("binary", "binary client"),
        ("http", "HTTP (POST, GET result)"),
        ("floor", "HTTP floor (GET /healthz)"),
    ):
        p50, p90 = quantiles(samples[name])
        print(f"{label:28} {p50:8.2f} {p90:8.2f}")
    b50, h50 = statistics.median(samples["binary"]), statistics.median(samples["http"])
    print(f"HTTP over binary at p50: +{h50 - b50:.2f} ms ({h50 / b50:.2f}x)")


async def rate(url: str, path: str, seconds: float, concurrency: int) -> float:
    """Requests per second of GET `path`, `concurrency` at once, each on its connection."""
    done = 0
    end = time.perf_counter() + seconds

    async def loop(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < end:
            async with session.get(url + path) as r:
                assert r.status == 200, await r.text()
                await r.read()
            done += 1

    sessions = [aiohttp.ClientSession() for _ in range(concurrency)]
    try:
        began = time.perf_counter()
        await asyncio.gather(*(loop(s) for s in sessions))
        return done / (time.perf_counter() - began)
    finally:
        for s in sessions:
            await s.close()


async def describe_rate(args: argparse.Namespace, url: str) -> None:
    print(f"\nGET /v1/runs/{{id}}, {args.concurrency} in flight for {args.seconds:g} s")
    for label, path in (
        ("summary and journal", "/v1/runs/http-0-0"),
        ("summary (journal=false)", "/v1/runs/http-0-0?journal=false"),
    ):
        print(f"{label:28} {await rate(url, path, args.seconds, args.concurrency):8.0f} requests/s")


async def listing(
    args: argparse.Namespace, client: fusee.Client, http: aiohttp.ClientSession, url: str
) -> None:
    have = args.runs * args.rounds * 2 + 100
    todo = list(range(max(0, args.list_runs - have)))
    began = time.perf_counter()
    for at in range(0, len(todo), 200):
        await asyncio.gather(*(client.start("gather", f"list-{i:06}", []) for i in todo[at : at + 200]))
    print(
        f"\nGET /v1/runs?limit=50 with {have + len(todo)} runs ({len(todo)} started in {time.perf_counter() - began:.1f} s)"
    )

    async def page(params: dict[str, str]) -> dict:
        async with http.get(f"{url}/v1/runs", params=params) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    cursor = None  # the middle: half the runs paged through, 1,000 (the most) at a time
    for _ in range(max(1, args.list_runs // 2000)):
        cursor = (await page({"limit": "1000"} | ({"cursor": cursor} if cursor else {})))["nextCursor"]
    assert cursor is not None
    for label, params in (
        ("first page", {"limit": "50"}),
        ("a page in the middle", {"limit": "50", "cursor": cursor}),
    ):
        samples = await timed(args.pages, lambda _, params=params: page(params))  # type: ignore[misc]
        p50, p90 = quantiles(samples)
        print(f"{label:28} p50 {p50:7.1f} ms   p90 {p90:7.1f} ms")
    await ui_pages(args, client, http, url, cursor)


async def ui_pages(
    args: argparse.Namespace, client: fusee.Client, http: aiohttp.ClientSession, url: str, cursor: str
) -> None:
    """The web UI's pages, read as a browser reads the HTML (its static files are cached)."""
    run = await client.start("steps", "ui-steps", 20)
    await run.result()

    async def html(path: str) -> None:
        async with http.get(url + path) as r:
            assert r.status == 200 and "text/html" in r.headers["Content-Type"], await r.text()
            await r.read()

    print("\nthe web UI's pages, with those runs")
    for label, path in (
        ("runs page (first)", "/"),
        ("runs page (middle)", f"/?cursor={cursor}"),
        ("run page, no step", "/runs/http-0-0"),
        ("run page, 20 steps", "/runs/ui-steps"),
    ):
        await html(path)
        samples = await timed(args.pages, lambda _, path=path: html(path))  # type: ignore[misc]
        p50, p90 = quantiles(samples)
        print(f"{label:28} p50 {p50:7.1f} ms   p90 {p90:7.1f} ms")


async def main(args: argparse.Namespace, scratch: Path) -> None:
    server = await HttpServer(scratch / "data").ready()
    worker = Child([sys.executable, "-m", "tests.server_mode.worker", server.tcp])
    await worker.wait_for_async(r"^ready")
    client = await fusee.Client.connect(server.tcp)
    try:
        async with aiohttp.ClientSession() as http:
            await start_to_result(args, client, http, server.url)
            await describe_rate(args, server.url)
            if args.list_runs:
                await listing(args, client, http, server.url)
    finally:
        await client.close()


def cli() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=200, help="runs per round and way")
    parser.add_argument("--seconds", type=float, default=3.0, help="each requests/s window")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight for requests/s")
    parser.add_argument(
        "--list-runs", type=int, default=10_000, help="runs in the directory for the listing (0: skip)"
    )
    parser.add_argument("--pages", type=int, default=30, help="pages timed of each kind")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fusee-http-bench-"))
    return run_in(scratch, main(args, scratch))


if __name__ == "__main__":
    sys.exit(cli())
