"""A fault-injecting storage for tests: `FaultyStorage` wraps a `MemoryStorage` and, through
the storage contract alone, does to the engine what real storage does on a bad day. Every
fault keeps the contract, so whatever breaks is the engine's doing, never the wrapper's.

    storage = FaultyStorage(MemoryStorage(4, instant=False), Faults(delay=0.3, fail_flush=0.01), seed=7)
    t = await TestEngine.open(workflows=[...], storage=storage)

A `random.Random(seed)` drives every choice, so a run of the same calls injects the same
faults (real-time delays aside: `Faults.sleep_share=0` keeps it to loop turns). The faults,
and what each stands for:

- **Delayed durability** (`delay`, `min_turns`, `max_turns`, `max_delay_s`, `sleep_share`): a durable
  position the store reported is held back and delivered a few loop turns later, or after
  a short real sleep. A disk whose flush completes late, a writer thread that wakes the
  loop late, a server whose acknowledgment is slow on the wire.
- **Bursts** (`burst`): a held position waits for the ones after it, and they arrive
  together: either only the highest (coalesced, as a group commit acknowledges many
  flushes with one write) or each in order within one turn (a backlog of completions
  drained at once). Positions only ever grow: a lower one never follows a higher one, and
  a position already covered is not reported again.
- **Failed flush** (`fail_flush`): a flush reports an `OSError(EIO)` instead of a
  position, and the shard must stop and acknowledge nothing after. Half the time the
  write was never made (the records are lost with the lease); half the time it was made
  and only its completion failed (an `fsync` that returned EIO: the records may be there
  after a restart, though nothing acknowledged them). Either is what a failing disk or a
  yanked volume does.
- **Refused run-store write** (`refuse_put_run`): `put_run` writes nothing and reports an
  `OSError(ENOSPC)` from inside the call, as the contract says (the shard must not go on
  to reference the offset). A full disk.
- **Lost lease** (`revoke`): after a flush is asked for, the lease is taken away
  (`MemoryStorage.revoke`) on a later turn: the holder is told, and every write it makes
  from then on is refused. A server that gave the shard to another worker because this
  one went silent (a GC pause, a network partition).
- **Slow reads** (`slow_read`): a recovery page, a batch of run-store frames or the
  latest checkpoint takes a few loop turns (or a short sleep) to arrive. A cold cache, a
  remote round trip. `read_delay_s`: every frame read takes that long, without chance.

What the wrapper never does, because the contract forbids it: report a position beyond
what the memory store made durable, report a lower position after a higher one, report
anything after an error, after `close` or after `abandon`, or raise from `append`,
`flush` or `put_run`.

`shard_faults={index: Faults(...)}` gives one shard faults of its own (a disk that fails
under one shard only). `storage.injected` counts what was injected (by kind: delayed,
coalesced, held_for_burst, bursts, failed_flush, refused_put_run, revoked, slow_read);
`storage.failed` names the shards told of an error. `storage.suspended()` turns off the faults
that stop a shard (failed flushes, refused frames, lost leases) for a while, delays and
bursts staying on: a test reopens or inspects the engine in peace.

Four fault points outside `FaultyStorage`, each inert unless a test enters it (and undone
when it leaves): `held_recovery()` holds every shard recovery this process starts until
the test releases it (a recovery slower than the connection it began under: a call
relayed meanwhile, a reconnect granting the shard again); `held_read(store, ref)` holds
the first read of one run-store frame from any shard's store, memory or remote (a read
slower than what the run does meanwhile: its timer wakes it, it parks again or ends, its
shard closes); `held_checkpoint()` holds every close's checkpoint (a close that misses
its deadline: a shard let go as a crash lets it go, with records sent and not yet known
durable); `frozen_clock(module, now_ms)` stops a module's wall clock (the clock an
invocation's signature is checked against: the freshness window's edges).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from types import ModuleType, SimpleNamespace
from typing import Any

from fusee.journal import Ack, Msg
from fusee.storage.contract import PAGE_BYTES, Durability, Receive, Report, ShardStore, Storage
from fusee.storage.memory import MemoryStorage

__all__ = [
    "STOPPING",
    "Faults",
    "FaultyLease",
    "FaultyStorage",
    "Held",
    "HeldRead",
    "HeldRecovery",
    "frozen_clock",
    "held_checkpoint",
    "held_read",
    "held_recovery",
]

STOPPING = ("failed_flush", "refused_put_run", "revoked")
"""The kinds of fault that stop a shard (the others only slow it down)."""


@dataclass(frozen=True)
class Faults:
    """How often each fault strikes (probabilities, 0 to 1) and how long delays last. All
    off by default: `Faults()` injects nothing."""

    delay: float = 0.0
    """Per durable position the store reports: it is held back, then delivered."""
    min_turns: int = 1
    max_turns: int = 4
    """A held position is delivered after `min_turns` to `max_turns` loop turns..."""
    max_delay_s: float = 0.002
    """...or, for `sleep_share` of them, after a real sleep of up to this long."""
    sleep_share: float = 0.0
    """The share of delays (held positions, slow reads) that are real sleeps, not turns."""
    burst: float = 0.0
    """Per delivery of held positions: they wait for the next ones instead (at most
    `max_holds` times in a row), then arrive together."""
    max_holds: int = 3
    fail_flush: float = 0.0
    """Per flush the shard asks for: it fails (see the module's docstring)."""
    refuse_put_run: float = 0.0
    """Per run-store frame: the write is refused."""
    revoke: float = 0.0
    """Per flush the shard asks for: the lease is taken away on a later turn."""
    slow_read: float = 0.0
    """Per read (`records`, `get_runs`, `latest_checkpoint`): it takes a while."""
    read_delay_s: float = 0.0
    """Every run-store frame read takes this much longer (a real sleep, per frame), every
    time: a remote store's round trip, without `slow_read`'s chance."""

    def calm(self) -> Faults:
        """These faults without the ones that stop a shard."""
        return replace(self, fail_flush=0.0, refuse_put_run=0.0, revoke=0.0)


def _eio(what: str) -> OSError:
    return OSError(errno.EIO, f"injected fault: {what}")


class FaultyLease:
    """One shard's store under one lease epoch, wrapped: the contract's `ShardStore`. The
    memory store reports to `_on_report`; what the shard gets is decided here."""

    def __init__(self, storage: FaultyStorage, index: int, report: Report) -> None:
        self.storage = storage
        self.index = index
        self.report = report  # the shard's
        self.inner: ShardStore  # set once the memory storage opened the shard
        self.epoch = 0  # the inner store's, once opened
        self.delivered = 0  # the highest position the shard was told
        self.promised = 0  # the highest position told or held back to be told
        self.held: list[int] = []  # positions held back, increasing, all above `delivered`
        self.holds = 0  # how many times in a row the held positions waited for more
        self.generation = 0  # bumps to call off the delivery scheduled for `held`
        self.dead = False  # an error was reported, or closed/abandoned: nothing more is
        self.dropped = False  # closed or abandoned
        self.error: BaseException | None = None  # the error the shard was told, if any
        self.fail_next: BaseException | None = None  # the flush's write is made, then fails
        self.flushes = 0

    @property
    def faults(self) -> Faults:
        return self.storage.faults_for(self.index)

    # -- what the memory store reports ------------------------------------------------------

    def _on_report(self, value: int | BaseException) -> None:
        if self.dead:
            return
        if isinstance(value, BaseException):
            self._fail(value)  # the store's own failure (a revoked lease): at once, as it came
            return
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            if not self.storage.suspending:
                # The write covering this position was made; its completion failed. Told on
                # a later turn (this may be inside `append`).
                self.storage.injected["failed_flush"] += 1
                self._fail(error, later=True)
                return
        if value <= self.promised:
            return  # covered by one told or to be told: positions only grow
        self.promised = value
        rng = self.storage.rng
        faults = self.faults
        if self.held:
            self.held.append(value)  # behind one held back: it waits for that one's turn
            self.storage.injected["coalesced"] += 1
            return
        if faults.delay and rng.random() < faults.delay:
            self.held.append(value)
            self.storage.injected["delayed"] += 1
            self._schedule()
            return
        self._deliver(value)

    def _deliver(self, position: int) -> None:
        self.delivered = position
        self.report(position)

    def _schedule(self) -> None:
        self.generation += 1
        generation = self.generation
        self.storage.later(self.faults, lambda: self._release(generation))

    def _release(self, generation: int) -> None:
        if self.dead or generation != self.generation or not self.held:
            return
        faults = self.faults
        rng = self.storage.rng
        if self.holds < faults.max_holds and faults.burst and rng.random() < faults.burst:
            self.holds += 1  # wait for the positions after these: they come as one burst
            self.storage.injected["held_for_burst"] += 1
            self._schedule()
            return
        self.holds = 0
        held, self.held = self.held, []
        if len(held) > 1 and rng.random() < 0.5:
            # Each in order, in this one turn (the shard may stop or close in between).
            self.storage.injected["bursts"] += 1
            for position in held:
                if self.dead:
                    return
                if position > self.delivered:  # (a shard's report may have told a higher one)
                    self._deliver(position)
        elif held[-1] > self.delivered:
            self._deliver(held[-1])  # only the highest: it covers the others

    def _fail(self, error: BaseException, *, later: bool = False) -> None:
        """Tell the shard its store failed (once), and nothing after."""
        self.dead = True
        self.error = error
        self.held = []
        self.generation += 1
        self.storage.failed[self.index] = error
        if later:
            asyncio.get_running_loop().call_soon(self._tell, error)
        else:
            self.report(error)

    # -- the contract -----------------------------------------------------------------------

    def _tell(self, error: BaseException) -> None:
        if not self.dropped:  # closed or abandoned since: nothing is reported
            self.report(error)

    def append(self, entry: bytes) -> int:
        return self.inner.append(entry)

    def flush(self) -> None:
        if self.dead:
            return
        self.flushes += 1
        storage = self.storage
        faults = self.faults
        rng = storage.rng
        if not storage.suspending and faults.revoke and rng.random() < faults.revoke:
            storage.later(faults, self._revoke)
        if (
            not storage.suspending
            and self.fail_next is None
            and faults.fail_flush
            and rng.random() < faults.fail_flush
        ):
            if rng.random() < 0.5:
                # The write is never made: the error comes on a later turn (as a writer's
                # would), unless the faults were suspended by then.
                storage.later(faults, self._lose_flush)
                return
            self.fail_next = _eio("the flush's write completed with an error")
        self.inner.flush()

    def _lose_flush(self) -> None:
        if self.dead:
            return
        if self.storage.suspending:
            self.inner.flush()  # called off: the flush goes ahead after all
            return
        self.storage.injected["failed_flush"] += 1
        self._fail(_eio("the flush's write was lost"))

    def _revoke(self) -> None:
        storage = self.storage
        if self.dead or storage.suspending or storage.current.get(self.index) is not self:
            return  # let go, failed or replaced since: nothing to take away
        storage.injected["revoked"] += 1
        storage.inner.revoke(self.index)  # the memory store reports the lost lease

    def put_run(self, frame: bytes) -> int:
        storage = self.storage
        if (
            not self.dead
            and not storage.suspending
            and self.faults.refuse_put_run
            and storage.rng.random() < self.faults.refuse_put_run
        ):
            storage.injected["refused_put_run"] += 1
            self._fail(OSError(errno.ENOSPC, "injected fault: the run store refused a frame"))
            return 1 << 62  # never written: a shard that went on to read it would fail loudly
        return self.inner.put_run(frame)

    async def get_runs(self, offsets: Sequence[int]) -> list[bytes]:
        await self.storage.slow_read(self.faults)
        if self.faults.read_delay_s:
            await asyncio.sleep(self.faults.read_delay_s * len(offsets))
        return await self.inner.get_runs(offsets)

    async def latest_checkpoint(self) -> tuple[int, bytes] | None:
        await self.storage.slow_read(self.faults)
        return await self.inner.latest_checkpoint()

    async def records(self, after: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        await self.storage.slow_read(self.faults)
        return await self.inner.records(after, max_bytes)

    async def checkpoint(self, position: int, data: bytes) -> None:
        await self.inner.checkpoint(position, data)

    async def close(self) -> None:
        self._drop()
        await self.inner.close()

    def abandon(self) -> None:
        self._drop()
        self.inner.abandon()

    def fenced(self) -> bool:
        return self.inner.fenced()

    def _drop(self) -> None:
        self.dead = self.dropped = True
        self.held = []
        self.generation += 1
        if self.storage.current.get(self.index) is self:
            del self.storage.current[self.index]


class FaultyStorage:
    """A `MemoryStorage` (composed, not subclassed) whose shards' stores inject the faults
    `faults` asks for, each choice drawn from `random.Random(seed)`. See the module's
    docstring for each fault."""

    def __init__(
        self,
        inner: MemoryStorage,
        faults: Faults | None = None,
        seed: int = 0,
        shard_faults: dict[int, Faults] | None = None,
    ) -> None:
        self.inner = inner
        self.faults = faults or Faults()
        self.shard_faults = dict(shard_faults or {})  # one shard's own, instead of `faults`
        self.rng = random.Random(seed)
        self.shards = inner.shards
        self.durability: Durability = inner.durability
        self.injected: Counter[str] = Counter()
        self.current: dict[int, FaultyLease] = {}  # each shard's newest lease, while held
        self.failed: dict[int, BaseException] = {}  # shards told of an error, since `clear_failed`
        self.suspends = 0

    # -- controls ---------------------------------------------------------------------------

    def faults_for(self, index: int) -> Faults:
        return self.shard_faults.get(index, self.faults)

    @property
    def suspending(self) -> bool:
        return self.suspends > 0

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No fault that stops a shard while inside (delays and bursts go on); one already
        decided but not yet due (a lost flush, a revocation) is called off."""
        self.suspends += 1
        try:
            yield
        finally:
            self.suspends -= 1

    def clear_failed(self) -> dict[int, BaseException]:
        """The shards told of an error since the last call (a restart recovers them)."""
        failed, self.failed = self.failed, {}
        return failed

    def later(self, faults: Faults, fn: Callable[[], Any]) -> None:
        """Run `fn` a few loop turns from now, or after a short real sleep."""
        loop = asyncio.get_running_loop()
        if faults.sleep_share and self.rng.random() < faults.sleep_share:
            loop.call_later(self.rng.uniform(0, faults.max_delay_s), fn)
            return
        turns = self._turns(faults)

        def step(left: int) -> None:
            if left <= 1:
                fn()
            else:
                loop.call_soon(step, left - 1)

        loop.call_soon(step, turns)

    async def slow_read(self, faults: Faults) -> None:
        if not faults.slow_read or self.rng.random() >= faults.slow_read:
            return
        self.injected["slow_read"] += 1
        if faults.sleep_share and self.rng.random() < faults.sleep_share:
            await asyncio.sleep(self.rng.uniform(0, faults.max_delay_s))
            return
        for _ in range(self._turns(faults)):
            await asyncio.sleep(0)

    def _turns(self, faults: Faults) -> int:
        low = max(1, faults.min_turns)
        return self.rng.randint(low, max(low, faults.max_turns))

    def revoke(self, index: int) -> None:
        """Take shard `index`'s lease away now (as `MemoryStorage.revoke`), counted."""
        self.injected["revoked"] += 1
        self.inner.revoke(index)

    def stopping_faults(self) -> int:
        """How many faults that stop a shard were injected."""
        return sum(self.injected[kind] for kind in STOPPING)

    # -- the contract -----------------------------------------------------------------------

    async def open_shard(self, index: int, report: Report, receive: Receive) -> FaultyLease:
        lease = FaultyLease(self, index, report)
        lease.inner = await self.inner.open_shard(index, lease._on_report, receive)
        lease.epoch = lease.inner.epoch
        self.current[index] = lease
        self.failed.pop(index, None)
        return lease

    def relay(self, index: int, item: Msg | Ack) -> None:
        self.inner.relay(index, item)

    async def close(self) -> None:
        for lease in list(self.current.values()):
            lease._drop()
        await self.inner.close()

    async def abandon(self) -> None:
        for lease in list(self.current.values()):
            lease._drop()
        await self.inner.abandon()


def _conforms(storage: FaultyStorage, lease: FaultyLease) -> tuple[Storage, ShardStore]:
    """(For the type checker: the wrapper keeps the contract's shape.)"""
    return storage, lease


class Held:
    """What a held fault point gives the test: `reached` is set when something waits at
    it; `release()` lets it (and every later one) through."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()

    async def wait(self) -> None:
        """At the fault point: wait here until the test releases it."""
        if not self.released.is_set():
            self.reached.set()
            await self.released.wait()


class HeldRecovery(Held):
    """What `held_recovery()` gives the test (`recovering`: a recovery waits)."""

    @property
    def recovering(self) -> asyncio.Event:
        return self.reached


@contextlib.contextmanager
def held_recovery() -> Iterator[HeldRecovery]:
    """Every shard recovery this process's engines start waits until `release()`, then runs
    as it would have (the call of `fusee.engine.recovery.recover` that attaches a shard,
    in fusee/engine/opening.py, is wrapped)."""
    from fusee.engine import opening as opening_module

    held = HeldRecovery()
    real = vars(opening_module)["recover"]

    async def recover(shard: Any) -> None:
        await held.wait()
        await real(shard)

    with _replaced(opening_module, "recover", recover):
        try:
            yield held
        finally:
            held.release()


class HeldRead(Held):
    """What `held_read()` gives the test (`asked`: the read of frame `ref` waits)."""

    def __init__(self, ref: int) -> None:
        super().__init__()
        self.ref = ref

    @property
    def asked(self) -> asyncio.Event:
        return self.reached


@contextlib.contextmanager
def held_read(store: ShardStore, ref: int) -> Iterator[HeldRead]:
    """The first read of `store` (a shard's, of any storage) that asks for the frame at
    `ref` waits until `release()`; every other read goes through."""
    held = HeldRead(ref)
    real = store.get_runs

    async def get_runs(offsets: Sequence[int]) -> list[bytes]:
        if not held.reached.is_set() and ref in offsets:  # the first read of it alone
            await held.wait()
        return await real(offsets)

    with _replaced(store, "get_runs", get_runs):
        try:
            yield held
        finally:
            held.release()


@contextlib.contextmanager
def held_checkpoint() -> Iterator[Held]:
    """Every close's checkpoint (a shard being let go: `Shard.close`) that this process's
    engines take waits until `release()`, then is taken as it would have been; timed
    checkpoints go through (the shard's call of `fusee.engine.checkpoint.take` with
    `wait=True`, the close's, is wrapped). A disk or server slow to write the last
    checkpoint: the close runs into its deadline, and lets the shard go as a crash does."""
    from fusee.engine import checkpoint as checkpoint_module

    held = Held()
    real = vars(checkpoint_module)["take"]

    async def take(shard: Any, *, wait: bool = False) -> None:
        if wait:
            await held.wait()
        await real(shard, wait=wait)

    with _replaced(checkpoint_module, "take", take):
        try:
            yield held
        finally:
            held.release()


@contextlib.contextmanager
def frozen_clock(module: ModuleType, now_ms: int) -> Iterator[None]:
    """`module`'s wall clock (the `time` module it imported, as `fusee.protocol.signature`
    does) stopped at `now_ms`, unix ms, until the block ends."""
    with _replaced(module, "time", SimpleNamespace(time=lambda: now_ms / 1000)):
        yield


@contextlib.contextmanager
def _replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    """`module.name` (or an object's attribute) is `value` until the block ends."""
    own = vars(module)
    had, real = name in own, own.get(name)
    setattr(module, name, value)
    try:
        yield
    finally:
        if had:
            setattr(module, name, real)
        else:
            delattr(module, name)  # the class's again
