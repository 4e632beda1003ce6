"""Real processes, for the tests and bench/: `fusee server`, workers, uvicorn serving a
handler, the Lambda runtime, each on loopback, its output (stdout and stderr, in the order
written) collected line by line by a thread, stopped with real signals.

`Proc(..., session=True)` (bench/) runs the child in its own session, so a Ctrl-C in the
terminal reaches the benchmark alone, which then stops its children in order before it
removes their directories. On Linux such a child also gets SIGTERM when its parent dies
without that chance (SIGKILL): `prctl(PR_SET_PDEATHSIG)` before the exec, from a small
launcher, since `preexec_fn` is unsafe in a process with threads."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from signal import SIGCONT, SIGKILL, SIGTERM
from typing import IO, TypeVar

import fusee

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]

# argv: parent pid, then the program. PR_SET_PDEATHSIG is 1; a parent that died before
# the prctl took effect shows as a new parent pid.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


_LEASED = re.compile(r"shard (\d+): leased to (.+) \(epoch (\d+)\)")
_FREED = re.compile(r"shard (\d+): (released by|let go: )(.*)\(epoch (\d+)\)")


def free_port() -> int:
    """A loopback port free now (a server told to listen on it can take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without its FUSEE_ settings, plus `settings`: a handler
    configured by what the test says alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(settings)
    return env


class Proc:
    """A child process whose output is read into `lines` (and `stamped`, with the monotonic
    time each arrived) by a thread.

    `env` is added to this process's environment (PYTHONPATH naming the repository), or
    with `inherit=False` is the child's whole environment (see `environment`)."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        *,
        inherit: bool = True,
        cwd: Path = ROOT,
        stdin: bool = False,
        session: bool = False,
    ) -> None:
        self.args = args
        self.lines: list[str] = []
        self.stamped: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        if inherit:
            env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        launch = args
        if session and sys.platform == "linux":
            launch = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *args]
        self.popen = subprocess.Popen(
            launch,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=session,  # a terminal's Ctrl-C goes to the benchmark alone
        )
        self.pid = self.popen.pid  # the launcher execs: the same pid
        assert self.popen.stdout is not None
        self.drain = threading.Thread(target=self._drain, args=(self.popen.stdout,), daemon=True)
        self.drain.start()

    @property
    def lock(self) -> threading.Condition:
        """Held to read `lines` while the thread appends."""
        return self.changed

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.stamped.append((time.monotonic(), self.lines[-1]))
                self.changed.notify_all()

    def _find(self, compiled: re.Pattern[str], start: int) -> re.Match[str] | None:
        for line in self.lines[start:]:
            found = compiled.search(line)
            if found:
                return found
        return None

    def _ended(self) -> bool:
        """It exited and all it wrote has been read."""
        return self.popen.poll() is not None and not self.drain.is_alive()

    def wait_for(self, pattern: str, timeout: float = 20.0, start: int = 0) -> re.Match[str]:
        """The first line from index `start` on that matches `pattern`."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = self._find(compiled, start)
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or self._ended():
                    raise AssertionError(f"{self.name()}: no line matching {pattern!r}:\n" + self.output())
                self.changed.wait(min(left, 0.1))

    async def wait_for_async(self, pattern: str, timeout: float = 30.0, start: int = 0) -> re.Match[str]:
        """`wait_for`, polled on the loop, so that a cancellation (a Ctrl-C) is seen at once."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            with self.changed:
                found = self._find(compiled, start)
            if found:
                return found
            if self._ended() or time.monotonic() > deadline:
                code = self.popen.returncode
                raise AssertionError(
                    f"{self.name()} (exit {code}): no line matching {pattern!r}:\n{self.output()}"
                )
            await asyncio.sleep(0.01)

    def name(self) -> str:
        return " ".join(Path(a).name for a in self.args[1:4])

    def output(self, last: int = 80) -> str:
        with self.changed:
            return "\n".join(self.lines[-last:])

    def send(self, line: str) -> None:
        """A line to its stdin (`stdin=True`)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def kill(self) -> None:
        self.signal(SIGKILL)
        self.popen.wait(10)

    def close(self) -> None:
        """After the process ended: its output read to the end, its pipes closed."""
        self.drain.join(5)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass  # a stdin pipe the child stopped reading

    def end(self, signum: int = SIGTERM, timeout: float = 15.0) -> int:
        """`signum` (a stopped process continued first), SIGKILL if it has not exited within
        `timeout`; its output read and its pipes closed. Its exit code; never raises."""
        self._end(signum, timeout)
        return self.popen.returncode

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, which it must obey within `timeout` (else killed, and an AssertionError)."""
        if not self._end(SIGTERM, timeout):
            raise AssertionError(f"{self.name()} did not stop on SIGTERM:\n{self.output()}")
        return self.popen.returncode

    def _end(self, signum: int, timeout: float) -> bool:
        """`end`; False if it had to be killed."""
        obeyed = True
        if self.popen.poll() is None:
            self.signal(SIGCONT)
            self.signal(signum)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                obeyed = False
        self.close()
        return obeyed


class Server(Proc):
    """`fusee server` on `dir`, ready when constructed."""

    def __init__(
        self,
        dir: Path,
        *extra: str,
        shards: int = 4,
        listen: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = dir
        args = [sys.executable, "-m", "fusee", "server", "--dir", str(dir), "--shards", str(shards)]
        if listen:
            args += ["--listen", listen]
        super().__init__(args + list(extra), env)
        found = self.wait_for(r"listening on (127\.0\.0\.1:\d+)") if listen else None
        self.wait_for(r"ready")
        self.host_port = found.group(1) if found else ""

    def address(self, **options: str | int) -> str:
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return self.host_port + (f"?{query}" if query else "")

    def held(self) -> dict[int, str]:
        """Shard -> its holder and epoch, from the lease lines (at INFO for workers, DEBUG
        for invoked ones): what was leased and not released or let go of since."""
        held: dict[int, tuple[str, str]] = {}
        for line in list(self.lines):
            if found := _LEASED.search(line):
                held[int(found.group(1))] = (found.group(2), found.group(3))
            elif found := _FREED.search(line):
                shard = int(found.group(1))
                if shard in held and held[shard][1] == found.group(4):
                    del held[shard]
        return {shard: f"{who} (epoch {epoch})" for shard, (who, epoch) in held.items()}

    def leases(self) -> int:
        """How many leases it granted."""
        return sum(1 for line in list(self.lines) if _LEASED.search(line))


class Worker(Proc):
    """A worker process running tests/server_mode/worker.py; `held` is the shards it says
    it holds."""

    def __init__(
        self, address: str, steps_file: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        env = {**({"FUSEE_TEST_STEPS": str(steps_file)} if steps_file is not None else {}), **(env or {})}
        super().__init__([sys.executable, "-m", "tests.server_mode.worker", address], env)
        found = self.wait_for(r"^ready ?(.*)$")
        self.initial = [int(s) for s in found.group(1).split()]

    def held(self) -> set[int]:
        held: set[int] = set(self.initial)
        for line in list(self.lines):
            kind, _, rest = line.partition(" ")
            if kind == "reconnected":
                held.clear()
            elif kind == "took":
                held.add(int(rest))
            elif kind == "lost":
                held.discard(int(rest))
        return held


async def retry(call: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    """`call` until it is answered: a shard between holders (NoHolder), a worker that went
    away mid-call (Connection) or a shard letting go (LeaseLost) are retried, as a
    client of a failing-over cluster would."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except (fusee.NoHolderError, fusee.ConnectionError, fusee.LeaseLostError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def listed(
    client: fusee.Client, type: str | None = None, status: str | None = None
) -> list[fusee.RunSummary]:
    """A client's listing as a list (`client.list()` is an async iterator, as the
    engine's), for `retry(lambda: listed(client))`."""
    return [row async for row in client.list(type, status)]


def steps_seen(path: Path) -> dict[tuple[str, int], list[str]]:
    """What each step function returned, every time it ran (the side file)."""
    seen: dict[tuple[str, int], list[str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            wid, step, value = line.split(" ")
            seen.setdefault((wid, int(step)), []).append(value)
    return seen
