"""Child processes for bench/server_cost.py: a `fusee server` and worker processes, their
output collected line by line, their memory, CPU time and context switches read from
/proc, and all of them stopped however the benchmark ends.

Each child runs in its own session, so a Ctrl-C in the terminal reaches the benchmark
alone, which then stops its children in order (the server cleanly, on SIGINT) before it
removes its directories. On Linux each child also gets SIGTERM when the benchmark dies
without that chance (SIGKILL): `prctl(PR_SET_PDEATHSIG)` before the exec, from a small
launcher, since `preexec_fn` is unsafe in a process with threads (the local log's writer).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# argv: parent pid, then the program. PR_SET_PDEATHSIG is 1; a parent that died before
# the prctl took effect shows as a new parent pid.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

_started: list[Child] = []  # every child, for stop_all


class Child:
    """A child process whose stdout and stderr are read into `lines` by two threads."""

    def __init__(self, args: list[str], stdin: bool = False) -> None:
        self.args = args
        self.lines: list[str] = []
        self.lock = threading.Lock()
        launch = args
        if sys.platform == "linux":
            launch = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *args]
        self.popen = subprocess.Popen(
            launch,
            cwd=ROOT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C goes to the benchmark alone
        )
        _started.append(self)
        self.pid = self.popen.pid  # the launcher execs: the same pid
        self.drains = [
            threading.Thread(target=self._drain, args=(stream,), daemon=True)
            for stream in (self.popen.stdout, self.popen.stderr)
        ]
        for drain in self.drains:
            drain.start()

    def _drain(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    async def wait_for(self, pattern: str, timeout: float = 30.0, start: int = 0) -> re.Match[str]:
        """The first line from index `start` on that matches `pattern` (polled, so a
        cancellation, a Ctrl-C, is seen at once)."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                lines = self.lines[start:]
            for line in lines:
                found = compiled.search(line)
                if found:
                    return found
            if self.popen.poll() is not None and not any(d.is_alive() for d in self.drains):
                raise RuntimeError(f"{self.name()} exited ({self.popen.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name()}: no line matching {pattern!r}:\n{self.output()}")
            await asyncio.sleep(0.01)

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def name(self) -> str:
        return " ".join(Path(a).name for a in self.args[1:4])

    def output(self) -> str:
        with self.lock:
            return "\n".join(self.lines[-40:])

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

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """`signum`, then SIGKILL if it has not exited within `timeout`; the pipes closed."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signum)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass  # a stdin pipe the child stopped reading
        return self.popen.returncode


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
    """`fusee server` on loopback TCP (any free port) and a Unix socket."""

    def __init__(self, dir: Path, unix: Path, shards: int) -> None:
        args = [sys.executable, "-m", "fusee", "server", "--dir", str(dir), "--shards", str(shards)]
        super().__init__([*args, "--listen", "127.0.0.1:0", "--unix", str(unix)])
        self.unix = unix
        self.tcp = ""

    async def ready(self) -> Server:
        self.tcp = (await self.wait_for(r"listening on (127\.0\.0\.1:\d+)")).group(1)
        await self.wait_for(r"ready$")
        return self

    def address(self, path: str, **options: int) -> str:
        where = f"unix:{self.unix}" if path == "unix" else self.tcp
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return where + (f"?{query}" if query else "")

    def stop(self, signum: int = signal.SIGINT, timeout: float = 15.0) -> int | None:
        return super().stop(signum, timeout)  # SIGINT: leases released, the log closed


class Worker(Child):
    """A worker process running `server_cost.py --worker`: it answers on stdout and
    takes its commands on stdin (and exits when stdin closes)."""

    def __init__(self, script: Path, address: str, per_shard: int, run_steps: int) -> None:
        args = [sys.executable, str(script), "--worker", address]
        args += ["--in-flight", str(per_shard), "--run-steps", str(run_steps)]
        super().__init__(args, stdin=True)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Its stdin closed first: it closes its engine and exits; else `signum`."""
        if self.popen.poll() is None and self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
                self.popen.wait(min(timeout, 5.0))
            except (OSError, subprocess.TimeoutExpired):
                pass
        return super().stop(signum, timeout)


def stop_all() -> None:
    """Stop every child still running, the last started first (workers before their
    server)."""
    while _started:
        _started.pop().stop()
