"""The processes of the model test's invoked mode: a `fusee server --invoke-config` on a
fixed loopback port whose one endpoint is uvicorn serving invoke_handler_app.py on another
fixed port. No worker runs but the ones the server invokes. The moves SIGKILL the
handler (a new one starts on the same port, as a platform starts a new instance) or the
server (restarted on its directory and port).

Every line the processes print is kept with the time it arrived, so the test can tell
what happened while a call was in flight: the server's lease lines (`shard N: leased to
... (epoch E)`, `released by`, `let go`), the handler's trace (FUSEE_INVOKE_TRACE=1:
`fusee invoke ID +MSms left shard=N exit=budget ...`) and its request brackets."""

from __future__ import annotations

import http.client
import json
import re
import sys
from pathlib import Path
from typing import Any

from tests.support.procs import Proc, free_port

from .server_cluster import outputs, problems

SECRET = "model-invoke-secret-0123456789abcdef"
BUDGET_MS = 1_500  # an invocation with a gated step in flight ends with its budget
GRACE_MS = 2_000

LEASED = re.compile(r"shard (\d+): leased to (.+) \(epoch (\d+)\)")
FREED = re.compile(r"shard (\d+): (released by|let go: )(.*)\(epoch (\d+)\)")
LEFT = re.compile(r"fusee invoke (\S+) \+[\d.]+ms left shard=(\d+) exit=(\S+)")
REQUEST = re.compile(r"^request (\d+) (begin|end)")


class Handler(Proc):
    def __init__(self, port: int, server: str, root: Path, secret: Path) -> None:
        args = [sys.executable, "-m", "uvicorn", "tests.model.invoke_handler_app:app"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--loop", "asyncio"]
        env = {
            "FUSEE_URL": server,
            "FUSEE_INVOKE_SECRET_FILE": str(secret),
            "FUSEE_MODEL_DIR": str(root),
            "FUSEE_INVOKE_TRACE": "1",
        }
        super().__init__(args, env)
        self.port = port
        self.wait_for(r"Uvicorn running on")

    def in_flight(self) -> list[int]:
        """The requests it began and has not answered."""
        open_: set[int] = set()
        for line in list(self.lines):
            found = REQUEST.match(line)
            if found:
                number = int(found.group(1))
                (open_.add if found.group(2) == "begin" else open_.discard)(number)
        return sorted(open_)

    def left(self, shard: int | None, since: float) -> list[str]:
        """Trace lines since `since` of an invocation leaving `shard` (any, if None) other
        than idle: by its budget, or with its lease lost."""
        found = []
        for at, line in list(self.stamped):
            match = LEFT.search(line) if at >= since else None
            if match and match.group(3) != "idle" and (shard is None or int(match.group(2)) == shard):
                found.append(line[line.index("fusee invoke") :])
        return found

    def budget_ends(self) -> int:
        return sum(1 for line in list(self.lines) if (m := LEFT.search(line)) and m.group(3) == "budget")

    def left_over(self) -> dict[str, Any]:
        """What the process keeps between invocations (`GET /model/tasks`)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/model/tasks")
            answer: dict[str, Any] = json.loads(conn.getresponse().read())
            return answer
        finally:
            conn.close()


class InvokeServer(Proc):
    def __init__(self, dir: Path, config: Path, listen: str) -> None:
        args = [sys.executable, "-m", "fusee", "server", "--dir", str(dir), "--shards", "4"]
        # An invoked worker's lease lines are DEBUG (docs/server.md): held() reads them.
        args += ["--listen", listen, "--invoke-config", str(config), "--log-level", "debug"]
        super().__init__(args, {"FUSEE_INVOKE_TRACE": "1"})
        self.wait_for(r"listening on")
        self.wait_for(r"ready")
        self.host_port = listen

    def held(self) -> dict[int, str]:
        """Shard -> its holder and epoch, from the lease lines: what was leased and not
        released or let go of since."""
        held: dict[int, tuple[str, str]] = {}
        for line in list(self.lines):
            if found := LEASED.search(line):
                held[int(found.group(1))] = (found.group(2), found.group(3))
            elif found := FREED.search(line):
                shard = int(found.group(1))
                if shard in held and held[shard][1] == found.group(4):
                    del held[shard]
        return {shard: f"{who} (epoch {epoch})" for shard, (who, epoch) in held.items()}

    def leases(self) -> int:
        return sum(1 for line in list(self.lines) if LEASED.search(line))


class InvokeCluster:
    def __init__(self, root: Path, budget_ms: int = BUDGET_MS) -> None:
        self.root = root
        (root / "valve").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.handler_port = free_port()
        self.host_port = f"127.0.0.1:{self.port}"
        self.secret = root / "invoke-secret"
        self.secret.write_text(SECRET)
        self.config = root / "invoke.json"
        endpoint = {
            "url": f"http://127.0.0.1:{self.handler_port}/",
            "secretFile": str(self.secret),
            "budgetMs": budget_ms,
            "graceMs": GRACE_MS,
        }
        self.config.write_text(json.dumps({"endpoints": [endpoint]}))
        self.gone: list[Proc] = []  # killed processes, their pipes closed at the end
        self.valve_openings = 0
        self.handler = self._handler()  # first: the starting server invokes every shard
        self.server = InvokeServer(root / "server", self.config, self.host_port)

    def _handler(self) -> Handler:
        return Handler(self.handler_port, self.host_port, self.root, self.secret)

    def address(self) -> str:
        return self.host_port

    def kill_handler(self) -> None:
        """SIGKILL the handler's process; a fresh one serves the same port."""
        self.handler.kill()
        self.handler.close()
        self.gone.append(self.handler)
        self.handler = self._handler()

    def restart_server(self) -> None:
        """SIGKILL, and a new server on the same directory and port."""
        self.server.kill()
        self.server.close()
        self.gone.append(self.server)
        self.server = InvokeServer(self.root / "server", self.config, self.host_port)

    def handlers(self) -> list[Handler]:
        return [*(proc for proc in self.gone if isinstance(proc, Handler)), self.handler]

    def left(self, shard: int | None, since: float) -> list[str]:
        """`Handler.left` over every handler process, killed ones included."""
        return [line for handler in self.handlers() for line in handler.left(shard, since)]

    def budget_ends(self) -> int:
        return sum(handler.budget_ends() for handler in self.handlers())

    def open_valve(self) -> None:
        (self.root / "valve" / f"open-{self.valve_openings}").touch()
        self.valve_openings += 1

    def problems(self) -> list[str]:
        return problems([self.server, self.handler, *self.gone])

    def outputs(self) -> str:
        return outputs([self.server, self.handler])

    def close(self) -> None:
        for proc in [self.handler, self.server]:
            proc.end(timeout=10)  # killed if it does not stop
        for proc in self.gone:
            proc.close()
