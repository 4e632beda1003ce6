"""What a worker process of the tests (tests/server_mode/worker.py, the model's
tests/model/server_worker.py) prints for the harness to read (tests/support/procs.py's
`Worker.held`): a line per shard it takes or loses."""

from __future__ import annotations

import fusee


def print_shards(engine: fusee.Engine, held: set[int]) -> set[int]:
    """`took N` for each shard the engine holds now and did not in `held`, `lost N` for each
    it no longer holds; what it holds now."""
    now = {s.index for s in engine.shards}
    for index in sorted(now - held):
        print("took", index, flush=True)
    for index in sorted(held - now):
        print("lost", index, flush=True)
    return now
