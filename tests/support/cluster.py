"""One cluster of real processes on loopback, for tests/invoke/, tests/model/ and
bench/invoke_cost.py: a `fusee server` on a port fixed for the cluster's life (a restart
takes the same directory and port), and what serves it, an invoked handler (uvicorn, on a
port of its own that the server's endpoint names) or workers. Killed processes are kept
in `gone`, their output read to the end, for a failure's report.

Every process it starts is also put in `procs` (the tests' `procs` fixture, which kills
what is left at the end); `close` stops them itself, for callers without the fixture.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import fusee
from tests.support.procs import Proc, Server, free_port, retry
from tests.support.waiting import eventually

SECRET = "end-to-end-secret-0123456789abcdef"
# An invoked worker's lease lines are DEBUG (docs/server.md): `Server.held` reads them.
LEASE_LINES = ("--log-level", "debug")

# Lines in a process's output that no run should cause: an exception that escaped (a
# loop's errors), a coroutine never awaited, a server that stopped its log. (Warnings
# such as a shard not taken over are part of failing over.)
PROBLEMS = re.compile(r"Traceback|never retrieved|never awaited|CRITICAL|Fatal|panicked")

H = TypeVar("H", bound=Proc)


class Handler(Proc):
    """uvicorn serving `app` on `port`, on `loop` (pinned: with uvloop installed, uvicorn's
    default would pick it), `env` added to its environment."""

    def __init__(
        self,
        port: int,
        env: dict[str, str],
        app: str = "handlers.asgi:app",
        loop: str = "asyncio",
        *extra: str,
    ) -> None:
        args = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
        super().__init__([*args, *extra, "--loop", loop], env)
        self.port = port
        self.wait_for(r"Uvicorn running on")


class Cluster(Generic[H]):
    """The server's directory is `root/data`; `secret` is written to `root/invoke-secret`
    for the server to sign invocations with. The handler `start_handler` starts by
    default serves handlers/asgi.py on `loop` with `workflows`, its steps written to
    `root/steps.txt` (`procs.steps_seen`)."""

    def __init__(
        self,
        root: Path,
        *,
        procs: list[Proc] | None = None,
        secret: str = SECRET,
        loop: str = "asyncio",
        workflows: str = "tests.server_mode.flows",
    ) -> None:
        self.root = root
        self.loop = loop
        self.workflows = workflows
        self.steps = root / "steps.txt"
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.handler_port = free_port()
        self.host_port = f"127.0.0.1:{self.port}"
        self.secret_text = secret
        self.secret = root / "invoke-secret"
        self.secret.write_text(secret)
        self.procs: list[Proc] = procs if procs is not None else []
        self.server: Server | None = None
        self.handler: H | None = None
        self.gone: list[Proc] = []  # killed processes, their pipes closed at the end
        self.handlers_gone: list[H] = []
        self._server_args: tuple[tuple[str, ...], int, dict[str, str] | None] = ((), 4, None)
        self._make_handler: Callable[[], H] | None = None

    @property
    def handler_url(self) -> str:
        return f"http://127.0.0.1:{self.handler_port}/"

    def address(self, **options: str | int) -> str:
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return self.host_port + (f"?{query}" if query else "")

    def invoking(self, url: str | None = None) -> tuple[str, ...]:
        """The server's options that invoke `url` (the handler's, by default), signed with
        the cluster's secret."""
        return ("--invoke", url or self.handler_url, "--invoke-secret-file", str(self.secret))

    def invoke_config(self, **endpoint: Any) -> tuple[str, ...]:
        """The server's options that name the handler as the one endpoint of an
        `--invoke-config` file, with `endpoint`'s settings (`budgetMs=1000`...)."""
        config = self.root / "invoke.json"
        entry = {"url": self.handler_url, "secretFile": str(self.secret), **endpoint}
        config.write_text(json.dumps({"endpoints": [entry]}))
        return ("--invoke-config", str(config))

    def start_server(self, *args: str, shards: int = 4, env: dict[str, str] | None = None) -> Server:
        """`fusee server` on the cluster's directory and port with `args`, ready."""
        self._server_args = (args, shards, env)
        self.server = Server(self.root / "data", *args, shards=shards, listen=self.host_port, env=env)
        self.procs.append(self.server)
        return self.server

    def restart_server(self) -> Server:
        """SIGKILL, and the same server again on its directory and port."""
        assert self.server is not None
        self._gone(self.server)
        args, shards, env = self._server_args
        return self.start_server(*args, shards=shards, env=env)

    def start_invoked(self, *extra: str, shards: int = 4) -> Server:
        """`fusee server --invoke` the handler, with `extra` options."""
        return self.start_server(*self.invoking(), *LEASE_LINES, *extra, shards=shards)

    def start_invoked_config(self, **endpoint: Any) -> Server:
        """`fusee server --invoke-config` naming the handler, with `endpoint`'s settings."""
        return self.start_server(*self.invoke_config(**endpoint), *LEASE_LINES)

    def handler_env(self) -> dict[str, str]:
        """The environment of handlers/asgi.py serving this cluster's server."""
        return {
            "FUSEE_URL": self.host_port,
            "FUSEE_INVOKE_SECRET": self.secret_text,
            "FUSEE_WORKFLOWS": self.workflows,
            "FUSEE_INVOKE_TRACE": "1",
            "FUSEE_TEST_STEPS": str(self.steps),
        }

    def start_handler(self, make: Callable[[], H] | None = None) -> H:
        """The handler `make` starts on `handler_port` (by default handlers/asgi.py), ready."""
        self._make_handler = make or self._default_handler
        self.handler = self._make_handler()
        self.procs.append(self.handler)
        return self.handler

    def _default_handler(self) -> Any:
        return Handler(self.handler_port, self.handler_env(), loop=self.loop)

    def kill_handler(self) -> H:
        """SIGKILL the handler's process; a fresh one serves the same port, as a platform
        starts a new instance."""
        assert self.handler is not None and self._make_handler is not None
        self._gone(self.handler)
        self.handlers_gone.append(self.handler)
        return self.start_handler(self._make_handler)

    def _gone(self, proc: Proc) -> None:
        proc.kill()
        proc.close()
        self.gone.append(proc)

    def handlers(self) -> list[H]:
        """Every handler process, killed ones included."""
        return [*self.handlers_gone, *([self.handler] if self.handler is not None else [])]

    async def client(self) -> fusee.Client:
        return await retry(lambda: fusee.Client.connect(self.host_port))

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p not in self.gone]

    def problems(self) -> list[str]:
        return problems([*self.live(), *self.gone])

    def outputs(self) -> str:
        return outputs(self.live())

    def close(self) -> None:
        """Every process stopped (SIGTERM, killed if it does not stop within 10 s): the
        handlers and workers, the last started first, then the server; killed ones' pipes
        closed."""
        for proc in sorted(reversed(self.live()), key=lambda p: p is self.server):
            proc.end(timeout=10)
        for proc in self.gone:
            proc.close()


def problems(procs: list[Proc]) -> list[str]:
    """The lines of `procs` no run should cause (PROBLEMS), each named."""
    return [
        f"{proc.args[2:4]} pid {proc.popen.pid}: {line}"
        for proc in procs
        for line in list(proc.lines)
        if PROBLEMS.search(line)
    ]


def outputs(procs: list[Proc]) -> str:
    """The last lines of each of `procs`, for a failure's report."""
    return "\n".join(
        f"--- {' '.join(proc.args[2:4])} pid {proc.popen.pid}:\n{proc.output()}" for proc in procs
    )


async def metrics(client: fusee.Client) -> dict[str, Any]:
    answer: dict[str, Any] = await client.call("invocations", {})
    return answer


async def quiet(
    client: fusee.Client, due_allowed: int = 0, *, every: float = 0.05, timeout: float = 30.0
) -> dict[str, Any]:
    """The metrics once nothing is being invoked and nothing is due. `due_allowed`: shards
    whose next due time is far off (the metrics count those as due too)."""

    async def settled() -> dict[str, Any] | None:
        now = await metrics(client)
        if now["invokingShards"] == 0 and now["dueShards"] <= due_allowed and now["overdue"] == 0:
            return now
        return None

    result: dict[str, Any] = await eventually(settled, timeout=timeout, every=every)
    return result


_SEND = re.compile(r"fusee invoke: send invocation=\w+ url=(\S+) shards=\[([\d, ]*)\] reasons=(\S*)")


def sends(server: Server) -> list[tuple[str, list[int], set[str]]]:
    """(URL, shards, reasons) of every invocation the server sent so far (its
    FUSEE_INVOKE_TRACE=1 lines)."""
    found = []
    for line in list(server.lines):
        if match := _SEND.search(line):
            shards = [int(s) for s in match.group(2).split(",") if s.strip()]
            found.append((match.group(1), shards, set(match.group(3).split(","))))
    return found


def held_by_nobody(server: Server) -> bool:
    """Every lease the server granted was let go of (from its log lines, which need
    LEASE_LINES), and one was granted at least: a server that logs none proves nothing."""
    return server.leases() > 0 and not server.held()
