"""The processes of the model test's server mode: a `fusee server` on loopback and worker
processes running the model's workflows (server_worker.py), two holding two shards each
and one standby, started, SIGKILLed, SIGSTOPped and restarted by the moves of the state
machine. What the workers do outside the engine (step calls, tokens, compensations) is
read back from the ledger file they append to."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cluster import Cluster
from tests.support.postgres import Postgres, StoreServer
from tests.support.procs import Proc, Server, free_port

WORKERS = 3  # two holders of two shards each, one standby
MAX_SHARDS = 2


class ModelWorker(Proc):
    """A worker process; `ready` waits for its first engine."""

    def __init__(self, address: str, dir: Path, code: str) -> None:
        super().__init__(
            [sys.executable, "-m", "tests.model.server_worker", address, code], {"FUSEE_MODEL_DIR": str(dir)}
        )
        self.stopped = False

    def ready(self) -> None:
        self.wait_for(r"^ready ")

    def held(self) -> set[int]:
        held: set[int] = set()
        for line in list(self.lines):
            kind, _, rest = line.partition(" ")
            if kind == "ready":
                held = {int(s) for s in rest.split()[1:]}
            elif kind in ("reconnected", "disconnected"):
                held.clear()
            elif kind == "took":
                held.add(int(rest))
            elif kind == "lost":
                held.discard(int(rest))
        return held

    def connected(self) -> bool:
        """Its latest engine is open (not between a lost connection and the next)."""
        for line in reversed(list(self.lines)):
            kind = line.partition(" ")[0]
            if kind in ("ready", "reconnected"):
                return True
            if kind in ("disconnected", "closed"):
                return False
        return False

    def lifetime(self) -> str:
        """`PID.N` of its latest engine."""
        for line in reversed(list(self.lines)):
            kind, _, rest = line.partition(" ")
            if kind in ("ready", "reconnected"):
                return rest.split()[0]
        return f"{self.pid}.0"


class Valve:
    """The gate the model's gated steps wait at (server_worker.py and invoke_handler_app.py
    watch the directory): `open` lets the ones waiting now through."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "valve"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.openings = 0

    def next(self) -> Path:
        """The file the next `open` makes."""
        return self.dir / f"open-{self.openings}"

    def open(self) -> None:
        self.next().touch()
        self.openings += 1


class WorkersCluster(Cluster[Proc]):
    """The server, then the workers, connected one after another as they come up."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.valve = Valve(root)
        self.code = "right"
        self.workers: list[ModelWorker] = []
        self.start_server()
        self.start_workers(WORKERS)

    def start_workers(self, n: int) -> list[ModelWorker]:
        started = [ModelWorker(self.address(max_shards=MAX_SHARDS), self.root, self.code) for _ in range(n)]
        for worker in started:
            worker.ready()
        self.workers += started
        self.procs += started
        return started

    def holder_of(self, shard: int) -> ModelWorker | None:
        for worker in self.workers:
            if not worker.stopped and shard in worker.held():
                return worker
        return None

    def standby(self) -> ModelWorker | None:
        for worker in self.workers:
            if not worker.stopped and worker.connected() and not worker.held():
                return worker
        return None

    def all_connected(self) -> bool:
        return all(w.connected() for w in self.workers if not w.stopped)

    def kill_worker(self, worker: ModelWorker) -> None:
        self._gone(worker)
        self.workers.remove(worker)

    def exit_worker(self, worker: ModelWorker) -> None:
        """SIGTERM: a clean exit (its shards flushed, checkpointed and let go; steps still
        running are not waited for). A worker that does not exit is a failure."""
        worker.stop()
        worker.close()
        self.workers.remove(worker)
        self.gone.append(worker)


class StoreCluster(WorkersCluster):
    """The same cluster on the PostgreSQL store (docs/postgresql.md): two `fusee server
    --store` on one database, one owning the shards and one standing by, on ports fixed for
    the cluster's life; the workers and the client reach them through one address list.
    Its moves: the owner SIGKILLed (`restart_server`: the standby takes over, a new standby
    starts on the dead one's port), the owner SIGSTOPped past its lease and resumed
    (`stop_server`: it must step down, status 3), and the database's postmaster SIGKILLed
    and started again (`restart_database`)."""

    def __init__(self, root: Path, database: Postgres, url: str) -> None:
        self.database = database
        self.url = url
        self.ports = [free_port(), free_port()]
        self.servers: list[StoreServer] = []
        super().__init__(root)

    def address(self, **options: str | int) -> str:
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return ",".join(f"127.0.0.1:{port}" for port in self.ports) + (f"?{query}" if query else "")

    def start_server(self, *args: str, shards: int = 4, env: dict[str, str] | None = None) -> Server:
        owner = self._start(self.ports[0], standby=False)
        self._start(self.ports[1], standby=True)
        return owner  # type: ignore[return-value]  (what a test asks of Server: lines, pid)

    def _start(self, port: int, standby: bool) -> StoreServer:
        server = StoreServer(self.url, port, standby=standby)
        self.servers.append(server)
        self.procs.append(server)
        if not standby:
            self.server = server  # type: ignore[assignment]
        return server

    def owner(self) -> StoreServer | None:
        """The live server the database says owns the shards (its ID names its PID), or
        None (no live lease; the database not answering)."""
        try:
            owners = self.database.sql(
                "SELECT DISTINCT owner FROM fusee_shards WHERE expires > now()", self.url.rsplit("/", 1)[1]
            ).split()
        except subprocess.CalledProcessError:
            return None
        pids = {int(owner.split(":")[1]) for owner in owners}
        found = [s for s in self.servers if s.pid in pids and s.popen.poll() is None]
        return found[0] if len(found) == 1 else None

    def standby_for(self, gone: StoreServer) -> None:
        """A new standby on `gone`'s port, as a supervisor restarts a server."""
        self.servers.remove(gone)
        self._start(gone.port, standby=True)

    def restart_server(self) -> Server:
        deadline = time.monotonic() + 15
        while (owner := self.owner()) is None:
            assert time.monotonic() < deadline, "no server owns the shards"
            time.sleep(0.05)
        self._gone(owner)
        self.standby_for(owner)
        return owner  # type: ignore[return-value]

    def stopped_down(self, owner: StoreServer) -> int:
        """The deposed owner, resumed, exits by itself: its status (3: stepped down)."""
        code = owner.popen.wait(timeout=30)
        owner.close()
        self.gone.append(owner)
        self.standby_for(owner)
        return code

    def replace_exited(self) -> None:
        """A standby for every server that exited by itself (one that stepped down while
        the database was away longer than its lease)."""
        for server in list(self.servers):
            if server.popen.poll() is not None:
                server.close()
                self.gone.append(server)
                self.standby_for(server)


@dataclass
class StepCall:
    index: int  # its place among every call, in the order they were made
    kind: str  # call, gate
    key: str
    attempt: int
    lifetime: str
    value: int


@dataclass
class Ledger:
    """The workers' ledger file, read on as it grows."""

    path: Path
    offset: int = 0
    calls: dict[tuple[str, int], list[StepCall]] = field(default_factory=lambda: defaultdict(list))
    count: int = 0
    tokens: list[tuple[str, str]] = field(default_factory=list)
    comps: dict[tuple[str, int], list[str]] = field(default_factory=dict)

    def read(self) -> int:
        """Read what was appended since; returns how many step calls were made so far."""
        if not self.path.exists():
            return self.count
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            data = file.read()
        end = data.rfind(b"\n") + 1  # (a line being written is read next time)
        self.offset += end
        for line in data[:end].decode().splitlines():
            kind, *rest = line.split(" ")
            if kind in ("call", "gate"):
                key, attempt, lifetime, value = rest
                call = StepCall(self.count, kind, key, int(attempt), lifetime, int(value))
                self.calls[(key, int(attempt))].append(call)
                self.count += 1
            elif kind == "token":
                self.tokens.append((rest[0], rest[1]))
            elif kind == "comp":
                names = self.comps.setdefault((rest[0], int(rest[1])), [])
                if rest[2] not in names:
                    names.append(rest[2])
        return self.count


def status(status: str) -> str:
    """A run's status as the model reads it: a parked run is running."""
    return "running" if status == "parked" else status
