"""A private PostgreSQL cluster for the tests (Debian's `postgresql` package, which
scripts/setup installs where it is missing): `initdb` into a temporary directory, the
postmaster on a free loopback port, started, SIGKILLed and started again by the tests,
and stopped at the end. As root (CI) the cluster runs as the `postgres` user the package
creates: PostgreSQL refuses to run as root.

Each test takes a database of its own (`Postgres.database`), so tests never see each
other's rows; a primary and a streaming replica are two `Postgres` (`replica_of`).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.procs import Proc, free_port

_names = itertools.count()


def binaries() -> Path | None:
    """Where initdb, pg_ctl and postgres are (Debian keeps them out of PATH)."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    if binaries() is None:
        return "PostgreSQL is not installed (scripts/setup installs Debian's postgresql with apt, as root)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


class Postgres:
    """One cluster: `url(db)` reaches database `db` as the superuser `fusee`."""

    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        bindir = binaries()
        assert bindir is not None, missing()
        self.bin = bindir
        # Not under pytest's tmp_path: as root, that is 0700 and the postgres user could
        # not enter it.
        self.root = root or Path(tempfile.mkdtemp(prefix="fusee-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = port or free_port()
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def _own(self, path: Path) -> None:
        if self.user is not None:
            shutil.chown(path, self.user, self.user)

    def init(self, **settings: str) -> Postgres:
        self._own(self.root)
        self._run("initdb", "-D", str(self.data), "-U", "fusee", "--auth=trust", "-E", "UTF8", "--no-locale")
        self.configure(
            listen_addresses="'127.0.0.1'",
            port=str(self.port),
            unix_socket_directories=f"'{self.root}'",
            max_connections="200",
            shared_buffers="64MB",
            **settings,
        )
        return self

    def configure(self, **settings: str) -> None:
        with open(self.data / "postgresql.conf", "a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")

    def start(self) -> Postgres:
        # After a kill, a backend still attached to the old shared memory makes the new
        # postmaster refuse for a moment: tried again until the last one left.
        deadline = time.monotonic() + 30
        while True:
            done = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", check=False
            )
            if done.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"pg_ctl start failed: {done.stdout}{done.stderr}{self.log.read_text()[-2000:]}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def postmaster(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """SIGKILL the postmaster, as when the database's machine dies. Its backends see
        their parent gone and exit; `start` waits for the last of them."""
        pid = self.postmaster()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://fusee@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        done = self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "fusee", "-d", database,
                         "-At", "-v", "ON_ERROR_STOP=1", "-c", statement)  # fmt: skip
        return done.stdout.strip()

    def database(self) -> str:
        """A new empty database: its URL."""
        name = f"t{os.getpid()}_{next(_names)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def replica_of(self, primary: Postgres) -> Postgres:
        """This cluster as a streaming replica of `primary` (pg_basebackup), started."""
        self._own(self.root)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "fusee",
                  "-D", str(self.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        self.configure(port=str(self.port), unix_socket_directories=f"'{self.root}'")
        return self.start()

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class StoreServer(Proc):
    """`fusee server --store URL` on `port`: constructed once it is ready (it owns the
    shards) or, with `standby=True`, once it says it stands by."""

    def __init__(self, url: str, port: int, *extra: str, standby: bool = False, shards: int = 4,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.url = url
        self.port = port
        self.host_port = f"127.0.0.1:{port}"
        args = [sys.executable, "-m", "fusee", "server", "--store", url, "--shards", str(shards),
                "--listen", self.host_port, *extra]  # fmt: skip
        super().__init__(args, env)
        self.wait_for(r"standby at " if standby else r"ready", timeout=30)

    def address(self, **options: str | int) -> str:
        query = "&".join(f"{k.replace('_', '-')}={v}" for k, v in options.items())
        return self.host_port + (f"?{query}" if query else "")


async def owned_store(url: str, shards: int, address: str = "here:7600") -> tuple[Any, Any]:
    """A PostgreSQL store of `url` opened as a server opens it (the schema prepared, every
    shard claimed, the claim renewed), with shard 0's records 1 and 2 (b"a", b"b")
    committed: its pool and the store."""
    from fusee_server.postgres import database
    from fusee_server.postgres.ownership import Ownership
    from fusee_server.postgres.store import Batch, PgStore

    pool = await database.pool(url)
    count = await database.prepare(pool, url, shards)
    ownership = Ownership(pool, count, address)
    assert await ownership.claim()
    store = PgStore(pool, url, count, ownership)
    await store.take()
    batch = Batch()
    batch.records[0], batch.first[0] = [b"a", b"b"], 1
    await store._commit(batch)
    store._committed(batch)
    return pool, store
