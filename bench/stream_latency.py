"""How long a stream's chunk takes from `append` to a reader through a server (docs/
engine.md, *Streams*). Run on demand: `python bench/stream_latency.py` (not a timed test).

A `fusee server` and one worker process (tests/server_mode/worker.py), a step appending
its clock to a stream every 20 ms, and a client in this process reading it
(`client.run(id).stream`): each chunk's lateness is the reader's clock when it gets the
chunk less the chunk's value (one machine, one clock). Printed against the floor measured
in the same run: one durable flush (`disk-check`) and two TCP round trips to an idle
process (worker to server, server to client), since a reader gets a chunk only once it
is durable at the server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _floors import flush_ms, round_trips, times
from _server_procs import ROOT  # noqa: F401 (the repository on sys.path)

import fusee
from tests.support.procs import Server, Worker


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--chunks", type=int, default=500)
    parser.add_argument("--every-ms", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusee-stream-bench-") as scratch:
        flush = flush_ms(Path(scratch))
        quiet_rtt, _ = round_trips()
        floor = flush + 2 * quiet_rtt
        server = Server(Path(scratch) / "data")
        worker = Worker(server.address())
        try:
            client = await fusee.Client.connect(server.address())
            await client.start("ticker", "tick-1", {"n": args.chunks, "every_s": args.every_ms / 1000})
            late = []
            async for sent in client.run("tick-1").stream("ticks"):
                late.append((time.time() - sent) * 1000)
            await client.close()
        finally:
            worker.kill()
            server.kill()
    late.sort()
    p50, p90 = statistics.median(late), late[int(len(late) * 0.9)]
    print(
        f"floor: one durable flush {flush:.3f} ms + two round trips after quiet {2 * quiet_rtt:.3f} ms = {floor:.3f} ms"
    )
    print(
        f"append -> reader through the server, {len(late)} chunks every {args.every_ms:g} ms: "
        f"p50 {p50:.2f} ms ({times(p50, floor)}), p90 {p90:.2f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
