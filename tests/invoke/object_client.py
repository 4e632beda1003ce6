"""A client process for the invoked objects test: `python -m tests.invoke.object_client
ADDRESS CLIENT CALLS SEED`. It makes CALLS calls of `ledger.append` to keys k0..k99 from
8 tasks, each task's calls one after another; a call's ID is its entry, and a call is sent
again with that ID until answered (the handler SIGKILLed under it). Every tenth call also
peeks at its key with the shared handler.

Prints `ack TASK KEY ENTRY POSITION` for each answered call, `peek KEY N PENDING` for each
peek, `retry ENTRY ERROR` for each refused send, and `done` at the end."""

from __future__ import annotations

import asyncio
import random
import sys

import fusee

KEYS = 100
TASKS = 8
RETRIABLE = (
    fusee.NoHolderError,
    fusee.ConnectionError,
    fusee.LeaseLostError,
    fusee.RejectedError,
    fusee.ClosedError,
    fusee.BusyError,
)


async def until_answered(call: object, what: str) -> object:
    while True:
        try:
            return await call()  # type: ignore[operator]
        except RETRIABLE as error:
            print("retry", what, type(error).__name__, str(error)[:80].replace("\n", " "), flush=True)
            await asyncio.sleep(0.05)


async def task(client: fusee.Client, client_no: int, task_no: int, calls: int, seed: int) -> None:
    rng = random.Random(seed * 10_000 + client_no * 100 + task_no)
    for i in range(calls):
        key = f"k{rng.randrange(KEYS)}"
        entry = f"c{client_no}t{task_no}-{i}"
        ref = client.object_ref("ledger", key)
        position = await until_answered(
            lambda ref=ref, entry=entry: ref.call("append", entry, id=entry), entry
        )
        print("ack", task_no, key, entry, position, flush=True)
        if i % 10 == 0:
            seen = await until_answered(lambda ref=ref: ref.call("peek"), f"peek-{entry}")
            assert isinstance(seen, dict)
            print("peek", key, seen["n"], seen["pending"] or "-", flush=True)


async def main(address: str, client_no: int, calls: int, seed: int) -> None:
    async with await fusee.Client.connect(address) as client:
        share = [calls // TASKS + (1 if t < calls % TASKS else 0) for t in range(TASKS)]
        await asyncio.gather(*(task(client, client_no, t, n, seed) for t, n in enumerate(share)))
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
