"""This machine's floor under the invoked path, measured in the benchmark's own run
(bench/invoke_cost.py prints every figure beside it), from three pieces:

- RTT: a raw TCP round trip (one byte each way, TCP_NODELAY, blocking sockets) to a
  separate process that sits idle in recv(), sent after 20 ms of quiet (as each hop of a
  cold start wakes an idle process) and back to back: no Python path to speak of, only
  the kernel and the scheduler;
- flush: `fusee disk-check`'s p50 (the server's native check: durable 4 KiB writes in the
  scratch directory, O_DIRECT with RWF_DSYNC where the filesystem takes it);
- oversleep: how much later than asked `asyncio.sleep` returns after quiet (the loop's
  timer rounds up to the millisecond, and the process wakes from idle).

Printed beside them, not part of any floor: the same durable write after 20 ms of quiet
(a cold start's flush comes after quiet; on a VM's shared disk it is often several times
disk-check's back-to-back p50).

From them, the floors of the figures (docs/invoke.md says what each crosses):
- a cold start: 4 RTT (the start reaching the server and the request the handler, the
  connection, the lease, the append made durable) + 1 flush;
- a wake-up (the step after a sleep): oversleep + 1 RTT + 1 flush.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

QUIET_S = 0.02
SAMPLES = 100

# The idle peer: accepts one connection and echoes each byte until it closes.
_ECHO = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(1):
    conn.sendall(data)
"""


@dataclass
class Floors:
    rtt_quiet_ms: float  # p50, after QUIET_S of quiet
    rtt_busy_ms: float  # p50, back to back
    flush_ms: float  # disk-check's p50
    oversleep_ms: float  # p50
    flush_quiet_ms: float  # p50 of one durable 4 KiB write after QUIET_S of quiet (not a floor)

    @property
    def cold_start_ms(self) -> float:
        return 4 * self.rtt_quiet_ms + self.flush_ms

    @property
    def wake_up_ms(self) -> float:
        return self.oversleep_ms + self.rtt_quiet_ms + self.flush_ms

    def describe(self) -> str:
        return (
            f"This machine's floor, measured in this run: a raw TCP round trip to an idle process "
            f"(RTT) p50 {self.rtt_quiet_ms:.3f} ms after {QUIET_S * 1000:.0f} ms of quiet "
            f"({self.rtt_busy_ms:.3f} ms back to back); a durable flush (disk-check p50) "
            f"{self.flush_ms:.3f} ms (after {QUIET_S * 1000:.0f} ms of quiet: {self.flush_quiet_ms:.3f} ms, "
            f"not counted); asyncio.sleep's oversleep after quiet p50 {self.oversleep_ms:.3f} ms. "
            f"Cold-start floor = 4 RTT + 1 flush = {self.cold_start_ms:.2f} ms; "
            f"wake-up floor = oversleep + 1 RTT + 1 flush = {self.wake_up_ms:.2f} ms."
        )


def times(value_ms: float, floor_ms: float) -> str:
    """`value_ms` against its floor: "4.6\u00d7 its floor"."""
    return f"{value_ms / floor_ms:.1f}\u00d7 its floor" if floor_ms > 0 else "floor unknown"


def round_trips() -> tuple[float, float]:
    """p50 ms of a raw TCP round trip to an idle process: after quiet, back to back."""
    peer = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        port = int(peer.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            found = []
            for gap in (QUIET_S, 0.0):
                samples = []
                for _ in range(SAMPLES):
                    if gap:
                        time.sleep(gap)
                    began = time.perf_counter()
                    sock.sendall(b"x")
                    if sock.recv(1) != b"x":
                        raise RuntimeError("the echo process went away")
                    samples.append((time.perf_counter() - began) * 1000)
                found.append(statistics.median(samples))
        return found[0], found[1]
    finally:
        peer.kill()
        peer.wait()


def flush_ms(scratch: Path) -> float:
    """disk-check's p50 (fusee/_cli.py's `disk-check`: the same native check) in `scratch`."""
    from fusee_server import _native

    where = scratch / "disk-check"
    where.mkdir(exist_ok=True)
    latencies_ns, _ = _native.disk_check(str(where), 1.0)
    return statistics.median(latencies_ns) / 1e6


def flush_quiet_ms(scratch: Path) -> float:
    """p50 of one durable 4 KiB write (O_DIRECT with RWF_DSYNC, as the log writes; a
    buffered write and fdatasync where the filesystem refuses O_DIRECT) after quiet."""
    path = scratch / "disk-check" / "quiet"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        direct = True
    except OSError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        direct = False
    block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT requires
    block.write(b"q" * 4096)
    try:
        os.ftruncate(fd, 4096 * 64)
        os.fsync(fd)
        samples = []
        for i in range(SAMPLES // 2):
            time.sleep(QUIET_S)
            began = time.perf_counter()
            if direct:
                os.pwritev(fd, [block], 4096 * (i % 64), os.RWF_DSYNC)
            else:
                os.pwrite(fd, block, 4096 * (i % 64))
                os.fdatasync(fd)
            samples.append((time.perf_counter() - began) * 1000)
        return statistics.median(samples)
    finally:
        os.close(fd)


async def oversleep_ms(asked_s: float = QUIET_S) -> float:
    """p50 of how much later than `asked_s` asyncio.sleep(asked_s) returns."""
    samples = []
    for _ in range(SAMPLES // 2):
        began = time.perf_counter()
        await asyncio.sleep(asked_s)
        samples.append((time.perf_counter() - began - asked_s) * 1000)
    return statistics.median(samples)


async def measure(scratch: Path) -> Floors:
    """The floors, with the processes under test idle (call it between the rows)."""
    quiet, busy = await asyncio.to_thread(round_trips)
    flush = await asyncio.to_thread(flush_ms, scratch)
    flush_quiet = await asyncio.to_thread(flush_quiet_ms, scratch)
    return Floors(quiet, busy, flush, await oversleep_ms(), flush_quiet)
