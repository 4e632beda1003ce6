"""A client process for the invoked debounce and batch test: `python -m
tests.invoke.coordinator_client ADDRESS CLIENT EVENTS SEED`. It sends EVENTS events of
`gather`, every other one a debounce (keys d0..d2, SETTINGS["debounce"]) and the others
a batch event (keys b0..b2, SETTINGS["batch"]), after a random pause each, so some
windows close on `window` and others on `max_wait`. Each event has its own event ID and is
sent again, with that ID, until acknowledged (the handler SIGKILLed under it).

Each acknowledged event is printed as `ack KIND KEY EVENT RUN_ID SENT_MS ACKED_MS`: the
wall-clock times of its first send and of its acknowledgement, between which the
coordinator took it in. Each refused send is printed as `retry EVENT ERROR`; `done` ends."""

from __future__ import annotations

import asyncio
import random
import sys
import time

import fusee

SETTINGS = {
    "debounce": {"window": "200ms", "max_wait": "600ms"},
    "batch": {"max_events": 5, "max_wait": "300ms"},
}
KEYS = 3
# A refused send either did not count or counted under the event ID (its reply lost):
# sent again, it gets the first receipt. TimeoutError: a call the server gave up on.
RETRIABLE = (
    fusee.NoHolderError,
    fusee.ConnectionError,
    fusee.LeaseLostError,
    fusee.RejectedError,
    fusee.ClosedError,
    fusee.BusyError,
)


def now_ms() -> float:
    return time.time() * 1000


async def main(address: str, client_no: int, events: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + client_no)
    async with await fusee.Client.connect(address) as client:
        for i in range(events):
            kind = "debounce" if i % 2 == 0 else "batch"
            key = f"{kind[0]}{rng.randrange(KEYS)}"
            event = f"c{client_no}-{i}"
            sent = now_ms()
            while True:
                try:
                    if kind == "debounce":
                        run = await client.debounce(
                            "gather", key, [event], event_id=event, **SETTINGS["debounce"]
                        )
                    else:
                        run = await client.batch("gather", key, event, event_id=event, **SETTINGS["batch"])
                    break
                except RETRIABLE as error:
                    print(
                        "retry", event, type(error).__name__, str(error)[:80].replace("\n", " "), flush=True
                    )
                    await asyncio.sleep(0.05)
            print("ack", kind, key, event, run.id, f"{sent:.1f}", f"{now_ms():.1f}", flush=True)
            # Mostly short pauses (windows extend, batches fill), now and then a long one
            # (windows close on `window`, batches on `max_wait`).
            await asyncio.sleep(rng.choice([0.0, 0.01, 0.03, 0.06, 0.1, 0.4]))
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
