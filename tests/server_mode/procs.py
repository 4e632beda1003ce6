"""Real processes for the server-mode tests: `fusee server` and worker processes on
loopback, their output collected line by line, stopped with real signals."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, TypeVar

import fusee

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port free now (a server told to listen on it can take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
        self.drains = []
        for stream in (self.popen.stdout, self.popen.stderr):
            assert stream is not None
            drain = threading.Thread(target=self._drain, args=(stream,), daemon=True)
            drain.start()
            self.drains.append(drain)

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 20.0, start: int = 0) -> re.Match[str]:
        """The first line from index `start` on that matches `pattern`."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines[start:]:
                    found = compiled.search(line)
                    if found:
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self._more()):
                    raise AssertionError(f"{self.args[1:4]}: no line matching {pattern!r}:\n" + self.output())
                self.changed.wait(min(left, 0.1))

    def _more(self) -> bool:
        return any(drain.is_alive() for drain in self.drains)

    def close(self) -> None:
        """After the process ended: its output read to the end, its pipes closed."""
        for drain in self.drains:
            drain.join(5)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()

    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> int:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.args[1:4]} did not stop on SIGTERM:\n{self.output()}") from None


class Server(Proc):
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


class Worker(Proc):
    def __init__(self, address: str, steps_file: Path | None = None) -> None:
        env = {"FUSEE_TEST_STEPS": str(steps_file)} if steps_file is not None else {}
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
