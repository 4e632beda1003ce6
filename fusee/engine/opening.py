"""Opening an engine's shards: the storage `Engine.open` chooses from its arguments, and
attaching a shard (open its store under a lease, recover it, take it into service), all
of them side by side at open, one at a time later (a standby taking a shard let go of).

The engine (`fusee/engine/engine.py`) is reached through `OpeningEngine`: the storage,
whether it closed meanwhile, and `attached`, which takes a recovered shard into service.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from fusee._errors import ClosedError, RejectedError
from fusee.engine.recovery import recover
from fusee.engine.shard import Shard, ShardHost
from fusee.storage import Storage

if TYPE_CHECKING:
    from fusee.storage.remote import RemoteStorage


class OpeningEngine(ShardHost, Protocol):
    storage: Storage
    closed: bool

    def check_index(self, index: int) -> None:
        """Refuse what is not a shard of the storage."""

    def attached(self, shard: Shard) -> None:
        """Take a recovered shard into service."""


async def storage_for(
    dir: str | None, shards: int | None, durability: str, address: str | None, backup: str | None = None
) -> tuple[Storage, list[int] | None]:
    """The storage `Engine.open(dir, shards=, durability=, address=)` names: a directory is
    local mode, "server" (or FUSEE_URL set, for an `open()` without arguments) a `fusee
    server`, "memory" nothing kept. With it, the shards a server granted this worker as
    it connected (None: every shard of the storage)."""
    if dir is None and durability == "memory" and address is None and os.environ.get("FUSEE_URL"):
        durability = "server"
    if backup is not None and dir is None:
        raise RejectedError(
            f"backup={backup!r}: a continuous backup is of a data directory: Engine.open(dir, backup=...) "
            "(a server's: fusee server --backup)"
        )
    if dir is not None:
        return await _local_storage(dir, shards, backup), None
    if durability == "server":
        remote = await _remote_storage(address)
        return remote, remote.initial_shards
    if durability == "memory":
        from fusee.storage.memory import MemoryStorage  # not on an invoked cold path

        return MemoryStorage(shards or 4), None
    raise RejectedError(
        f"durability={durability!r}: open with a directory (local mode), "
        "durability='server' with an address, or durability='memory'"
    )


async def open_shards(engine: OpeningEngine, shard_ids: Sequence[int] | None) -> None:
    """Open and recover the shards the engine holds (all, unless `shard_ids` names some:
    an invoked worker holds only the shards it was granted), side by side."""
    indexes = list(shard_ids) if shard_ids is not None else list(range(engine.storage.shards))
    for index in indexes:
        engine.check_index(index)
    # Recovery allocates a run state per run it replays, all of them kept: the cyclic
    # collector would scan them again and again for nothing (a third of the time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        unique = list(dict.fromkeys(indexes))
        if len(unique) == 1:
            # Awaited here: a task and a gather for one shard cost an invoked cold start
            # two turns of the loop (about 0.1 ms when the process just woke).
            await attach(engine, unique[0])
        else:
            await asyncio.gather(*(attach(engine, index) for index in unique))
    finally:
        if collecting:
            gc.enable()


async def attach(engine: OpeningEngine, index: int) -> None:
    """Open shard `index`, recover it and take it into service."""
    # A duration, so perf_counter: uvloop's loop.time() moves in whole milliseconds,
    # once per loop turn, and would report most opens as 0.
    began = time.perf_counter()
    shard = Shard(engine, index)
    shard.store = await engine.storage.open_shard(index, shard.durability.on_durable, shard.on_relayed)
    try:
        await recover(shard)
    except BaseException:
        shard.drop()
        raise
    if engine.closed:
        shard.drop()
        raise ClosedError("the engine is closed; open a new one")
    if shard.stop_error is not None:
        # Its lease went while it recovered (a lost connection): attached now, the shard
        # would sit in the engine stopped, and its next grant could never attach.
        shard.store.abandon()
        raise shard.stop_error
    shard.open_ms = (time.perf_counter() - began) * 1000
    engine.attached(shard)


async def _local_storage(dir: str, shards: int | None, backup: str | None = None) -> Storage:
    """Local mode needs the disk path of the fusee-server distribution."""
    try:
        from fusee_server.store import LocalStorage
    except ImportError:
        raise RejectedError(
            "local mode (Engine.open(dir)) needs the fusee-server distribution, which holds the "
            "disk path: pip install fusee-server (in this repository: pip install ./server)"
        ) from None
    return await LocalStorage.open(dir, shards, backup=backup)


async def _remote_storage(address: str | None) -> RemoteStorage:
    from fusee.protocol.address import parse as parse_address
    from fusee.storage.remote import RemoteStorage

    text = address if address is not None else os.environ.get("FUSEE_URL")
    if not text:
        raise RejectedError("durability='server' needs address='host:port' (or FUSEE_URL in the environment)")
    return await RemoteStorage.connect(parse_address(text))
