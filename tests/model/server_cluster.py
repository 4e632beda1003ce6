"""The processes of the model test's server mode: a `fusee server` on loopback and worker
processes running the model's workflows (server_worker.py), two holding two shards each
and one standby, started, SIGKILLed, SIGSTOPped and restarted by the moves of the state
machine. What the workers do outside the engine (step calls, tokens, compensations) is
read back from the ledger file they append to."""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cluster import Cluster
from tests.support.procs import Proc

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
