"""A client process for the batching test: `python -m tests.server_mode.batch_client
ADDRESS CLIENT EVENTS KEYS PAUSE`. It sends EVENTS batch events, PAUSE seconds apart, of `gather`, spread over KEYS
keys, each with its own event ID, and sends an event again, with the same ID, until it
is acknowledged (a worker killed under it, a shard between holders). Each acknowledged
event is printed as `ack EVENT RUN_ID`, then `done`."""

from __future__ import annotations

import asyncio
import sys

import fusee

RETRIABLE = (fusee.NoHolderError, fusee.ConnectionError, fusee.LeaseLostError, fusee.RejectedError)


async def main(address: str, client_no: int, events: int, keys: int, pause: float) -> None:
    async with await fusee.Client.connect(address) as client:
        for i in range(events):
            event = f"c{client_no}-{i}"
            while True:
                try:
                    run = await client.batch(
                        "gather", f"k{i % keys}", event, max_events=5, max_wait="300ms", event_id=event
                    )
                    break
                except RETRIABLE as error:
                    print("retry", event, type(error).__name__, flush=True)
                    await asyncio.sleep(0.05)
            print("ack", event, run.id, flush=True)
            await asyncio.sleep(pause)
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])))
