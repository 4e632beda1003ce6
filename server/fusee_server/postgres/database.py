"""Reaching the database: the `--store` URL checked, a connection pool, and the schema
created or upgraded (schema.py) before anything else is read.

The driver is asyncpg: it speaks PostgreSQL's binary protocol from asyncio with prepared
statements cached per connection, passes `bytes` and lists as `bytea` and arrays without
text escaping (a group commit's records go as one array each), and is the fastest
maintained asyncio driver. psycopg 3 would do too; it goes through libpq and its text
paths, and costs more per statement here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit

from fusee._errors import IoError, RejectedError, SettingError
from fusee_server.postgres import schema

logger = logging.getLogger("fusee.server")
# The pool's own reconnects log a traceback each; the store says it once (store.py).
logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)

CONNECT_TIMEOUT_S = 10.0
STATEMENT_TIMEOUT_MS = 30_000  # a statement stuck this long (a lock never let go) fails
POOL_MAX = 4  # reads of records, frames and checkpoints side by side
SHARDS_MAX = 256
IDLE_IN_TRANSACTION_MS = 5_000
SESSION: dict[str, Any] = {
    "command_timeout": STATEMENT_TIMEOUT_MS / 1000,
    "server_settings": {
        "application_name": "fusee server",
        # A server frozen inside a transaction (SIGSTOP, a paused VM) must not hold the
        # shards' row locks for longer than a lease: the database ends its session, and
        # a standby's claim goes through.
        "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_MS),
    },
}


def check_url(url: str) -> str:
    """`url`, if it can name a PostgreSQL database; else SettingError naming --store."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SettingError(
            f"--store {url!r}: expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE "
            "(a data directory goes in --dir)"
        )
    if not parts.path.strip("/") and "dbname=" not in parts.query:
        raise SettingError(f"--store {url!r}: name the database (postgresql://HOST/DATABASE)")
    return url


def driver() -> Any:
    try:
        import asyncpg  # type: ignore[import-untyped]
    except ImportError:
        raise SettingError(
            "--store postgresql://...: the PostgreSQL driver is not installed "
            "(pip install 'fusee-server[postgresql]')"
        ) from None
    return asyncpg


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a lost or restarting database raises: the outcome of a statement in flight is
    unknown, and the store asks again once it is back (store.py, `_commit`)."""
    asyncpg = driver()
    return (
        OSError,
        asyncio.TimeoutError,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash shutdown
        asyncpg.exceptions.ConnectionFailureError,
        # A connection left mid-protocol by a statement that failed as the database went
        # away ("another operation is in progress"): dropped, and the outcome asked for.
        asyncpg.exceptions.InternalClientError,
    )


def fenced(error: BaseException) -> bool:
    return getattr(error, "sqlstate", None) == schema.FENCED


async def pool(url: str) -> Any:
    """A pool of connections to `url`; IoError naming the store when it cannot connect."""
    asyncpg = driver()
    try:
        return await asyncpg.create_pool(
            url, min_size=1, max_size=POOL_MAX, timeout=CONNECT_TIMEOUT_S, reset=_keep_session, **SESSION
        )
    except connection_errors() as error:
        raise IoError(f"--store {_shown(url)}: cannot connect: {error}") from None
    except asyncpg.PostgresError as error:
        raise IoError(f"--store {_shown(url)}: {error}") from None


async def _keep_session(conn: Any) -> None:
    """What a connection goes back to the pool with: nothing to undo. The store sets no
    session state (no SET, LISTEN, cursor or session-level advisory lock; its one lock is
    a transaction's), and asyncpg's default reset costs a round trip per release: about
    150 µs of every group commit here (bench/server_cost.py --store postgresql)."""


async def connection(url: str) -> Any:
    """One connection of its own, with the pool's settings (the committer's: store.py)."""
    return await driver().connect(url, timeout=CONNECT_TIMEOUT_S, **SESSION)


def _shown(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


async def prepare(connections: Any, url: str, shards: int | None) -> int:
    """Create or upgrade the schema and return the store's shard count: `shards` (4 by
    default) for a new store; an existing one keeps its own, and another one asked for is
    refused as a data directory's is."""
    asyncpg = driver()
    try:
        async with connections.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", schema.LOCK_KEY)
            exists = await conn.fetchval("SELECT to_regclass('fusee_meta') IS NOT NULL")
            version = 0
            if exists:
                found = await conn.fetchval("SELECT value FROM fusee_meta WHERE key = 'schema_version'")
                version = _number(found, "schema_version", url) if found is not None else 0
            if version > schema.VERSION:
                raise RejectedError(
                    f"--store {_shown(url)}: its schema is version {version}, written by a newer "
                    f"fusee server; this one knows versions up to {schema.VERSION}"
                )
            if version < schema.VERSION:
                # CREATE makes the newest version; an older one climbs a step at a time.
                steps = (
                    [schema.CREATE]
                    if version == 0
                    else [schema.UPGRADES[v] for v in range(version, schema.VERSION)]
                )
                for step in steps:
                    await conn.execute(step)
                await conn.execute(
                    "INSERT INTO fusee_meta (key, value) VALUES ('schema_version', $1) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    str(schema.VERSION),
                )
            return await _shard_count(conn, url, shards)
    except connection_errors() as error:
        raise IoError(f"--store {_shown(url)}: lost the database while preparing it: {error}") from None
    except asyncpg.InsufficientPrivilegeError as error:
        raise IoError(
            f"--store {_shown(url)}: {error}; the server's role needs CREATE on the database's "
            "schema to make its tables (once), then SELECT, INSERT, UPDATE and DELETE on them"
        ) from None


async def _shard_count(conn: Any, url: str, shards: int | None) -> int:
    found = await conn.fetchval("SELECT value FROM fusee_meta WHERE key = 'shards'")
    if found is None:
        count = shards if shards is not None else 4
        if not 1 <= count <= SHARDS_MAX:
            raise RejectedError(f"--shards {count}: a store has 1 to {SHARDS_MAX} shards")
        await conn.execute("INSERT INTO fusee_meta (key, value) VALUES ('shards', $1)", str(count))
        await conn.execute(
            "INSERT INTO fusee_shards (shard) SELECT generate_series(0, $1 - 1) ON CONFLICT DO NOTHING",
            count,
        )
        return count
    count = _number(found, "shards", url)
    if not 1 <= count <= SHARDS_MAX:
        raise RejectedError(
            f"--store {_shown(url)}: fusee_meta says {count} shards; a store has 1 to {SHARDS_MAX}"
        )
    if shards is not None and shards != count:
        raise RejectedError(
            f"--store {_shown(url)} has {count} shards, not the {shards} asked for "
            f"(leave --shards out, or give --shards {count})"
        )
    rows = await conn.fetch("SELECT shard, position, runs_len, epoch FROM fusee_shards ORDER BY shard")
    damaged = [row["shard"] for row in rows if min(row["position"], row["runs_len"], row["epoch"]) < 0]
    if [row["shard"] for row in rows] != list(range(count)) or damaged:
        raise RejectedError(
            f"--store {_shown(url)}: fusee_shards is damaged: expected one row for each shard 0 to "
            f"{count - 1} with no negative position, run-store length or epoch; found shards "
            f"{[row['shard'] for row in rows]}"
            + (f", negative values in {damaged}" if damaged else "")
            + " (the database was changed by something other than a fusee server: restore it from a backup)"
        )
    return count


def _number(found: str, key: str, url: str) -> int:
    """A number fusee_meta keeps as text; RejectedError if it is not one."""
    try:
        return int(found)
    except ValueError:
        raise RejectedError(
            f"--store {_shown(url)}: fusee_meta's {key} is {found!r}, not a number (the database "
            "was changed by something other than a fusee server: restore it from a backup)"
        ) from None
