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
from pathlib import Path
from typing import Any

from tests.support.cluster import LEASE_LINES, Cluster
from tests.support.cluster import Handler as Uvicorn

from .server_cluster import Valve

SECRET = "model-invoke-secret-0123456789abcdef"
BUDGET_MS = 1_500  # an invocation with a gated step in flight ends with its budget
GRACE_MS = 2_000

LEFT = re.compile(r"fusee invoke (\S+) \+[\d.]+ms left shard=(\d+) exit=(\S+)")
REQUEST = re.compile(r"^request (\d+) (begin|end)")


class Handler(Uvicorn):
    """uvicorn serving invoke_handler_app.py, which runs the model's workflows."""

    def __init__(self, cluster: Cluster[Handler]) -> None:
        env = {
            "FUSEE_URL": cluster.host_port,
            "FUSEE_INVOKE_SECRET_FILE": str(cluster.secret),
            "FUSEE_MODEL_DIR": str(cluster.root),
            "FUSEE_INVOKE_TRACE": "1",
        }
        super().__init__(
            cluster.handler_port, env, "tests.model.invoke_handler_app:app", "asyncio", "--no-access-log"
        )

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


class InvokeCluster(Cluster[Handler]):
    """The handler first (the starting server invokes every shard), then the server."""

    def __init__(self, root: Path, budget_ms: int = BUDGET_MS) -> None:
        super().__init__(root, secret=SECRET)
        self.valve = Valve(root)
        self.start_handler(lambda: Handler(self))
        config = self.invoke_config(budgetMs=budget_ms, graceMs=GRACE_MS)
        self.start_server(*config, *LEASE_LINES, env={"FUSEE_INVOKE_TRACE": "1"})

    def left(self, shard: int | None, since: float) -> list[str]:
        """`Handler.left` over every handler process, killed ones included."""
        return [line for handler in self.handlers() for line in handler.left(shard, since)]

    def budget_ends(self) -> int:
        return sum(handler.budget_ends() for handler in self.handlers())
