"""Child processes for bench/server_cost.py, invoke_cost.py and limit_cost.py: a `fusee
server` and worker processes, on the tests' process harness (tests/support/procs.py, in its own
session and stopped with its parent: see there), their memory, CPU time and context
switches read from /proc, and all of them stopped however the benchmark ends (a Ctrl-C
reaches the benchmark alone, which stops its children in order, the server cleanly on
SIGINT, before it removes its directories).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support, when run as `python bench/x.py`

from tests.support.procs import Proc, free_port  # noqa: E402, F401 (after the path above; free_port for the benchmarks)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

_started: list[Child] = []  # every child, for stop_all


class Child(Proc):
    """A child process in its own session, its output read into `lines`; `stop` sends
    `stop_signal`, then SIGKILL if it has not exited in time, and never raises."""

    stop_signal: int = signal.SIGTERM

    def __init__(self, args: list[str], stdin: bool = False) -> None:
        super().__init__(args, None, inherit=False, stdin=stdin, session=True)
        _started.append(self)

    def cpu_s(self) -> float:
        """User plus system CPU seconds of every thread so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def voluntary_switches(self) -> int:
        return thread_switches(self.pid)

    def status_kib(self, key: str) -> int:
        """A `kB` line of /proc/PID/status, e.g. VmRSS (resident now), VmHWM (its peak)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def stop(self, timeout: float = 15.0) -> int:
        return self.end(self.stop_signal, timeout)


def thread_switches(pid: int | str) -> int:
    """Voluntary context switches of every live thread of `pid` (/proc/PID/status counts
    the main thread's alone)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # a thread that just ended
        found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M)
        if found:
            total += int(found.group(1))
    return total


class Server(Child):
    """`fusee server` on loopback TCP (any free port) and a Unix socket; or, given `store`
    (a PostgreSQL URL), on that database and the TCP port `port` alone, where `ready`
    returns once it owns the shards or, with `standby`, once it stands by."""

    def __init__(
        self, dir: Path, unix: Path, shards: int, store: str = "", port: int = 0, standby: bool = False
    ) -> None:
        args = [sys.executable, "-m", "fusee", "server", "--shards", str(shards)]
        if store:
            args += ["--store", store, "--listen", f"127.0.0.1:{port}"]
        else:
            args += ["--dir", str(dir), "--listen", "127.0.0.1:0", "--unix", str(unix)]
        super().__init__(args)
        self.unix = unix
        self.tcp = f"127.0.0.1:{port}" if store else ""
        self.standby = standby

    async def ready(self) -> Server:
        if self.standby:
            await self.wait_for_async(r"standby at ")
            return self
        self.tcp = (await self.wait_for_async(r"listening on (127\.0\.0\.1:\d+)")).group(1)
        await self.wait_for_async(r"ready$")
        return self

    def address(self, path: str, **options: int) -> str:
        where = f"unix:{self.unix}" if path == "unix" else self.tcp
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return where + (f"?{query}" if query else "")

    stop_signal = signal.SIGINT  # leases released, the log closed


class Worker(Child):
    """A worker process running `server_cost.py --worker`: it answers on stdout and
    takes its commands on stdin (and exits when stdin closes)."""

    def __init__(self, script: Path, address: str, per_shard: int, run_steps: int) -> None:
        args = [sys.executable, str(script), "--worker", address]
        args += ["--in-flight", str(per_shard), "--run-steps", str(run_steps)]
        super().__init__(args, stdin=True)

    def stop(self, timeout: float = 15.0) -> int:
        """Its stdin closed first: it closes its engine and exits; else SIGTERM."""
        if self.popen.poll() is None and self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
                self.popen.wait(min(timeout, 5.0))
            except (OSError, subprocess.TimeoutExpired):
                pass
        return super().stop(timeout)


def run_in(scratch: Path, main: Coroutine[Any, Any, None]) -> int:
    """`main` until it ends, a Ctrl-C or a SIGTERM; then every child stopped and `scratch`
    removed. The exit code: 0, or 130 when interrupted."""

    async def guarded() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await main

    try:
        asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopping the processes, removing " + str(scratch), file=sys.stderr)
        return 130
    finally:
        stop_all()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def stop_all() -> None:
    """Stop every child still running, the last started first (workers before their
    server)."""
    while _started:
        _started.pop().stop()
