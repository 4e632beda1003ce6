"""Per-shard counters: `engine.shard_metrics()`, and `fusee_<counter>{shard="N"}` in the
server's `/metrics` (docs/telemetry.md, *Metrics per shard*).

Each counter is kept where its event already happens, as a plain integer: a flush's
report, a gate's release, a checkpoint written, a run parked. The step path adds nothing
to count records (the shard's log position is the count) and one addition per record
for bytes. Durations are microseconds."""

from __future__ import annotations

COUNTERS = (
    "records",  # records staged in the shard's log by this holder
    "bytes",  # their encoded bytes
    "flushes",  # flushes the shard asked for that completed
    "flushed_records",  # records those flushes made durable (over `flushes`: the mean batch)
    "flush_us",  # time from asking for each flush to its durable report, summed
    "gated_waits",  # step attempts that waited for the records before them to be durable
    "gate_wait_us",  # how long they waited, summed
    "steps_executed",  # step attempts whose outcome was recorded here
    "steps_replayed",  # step outcomes handed back from the journal when runs were loaded
    "checkpoints",  # checkpoints written
    "parks",  # runs written to the run store and dropped from memory
    "determinism_errors",  # runs stopped because their code no longer matched their journal
    "busy_rejections",  # calls refused because the shard was too busy to take them
)
DOCS = {
    "records": "Records staged in the shard's log.",
    "bytes": "Encoded bytes of the records staged in the shard's log.",
    "flushes": "Flushes of the shard's records that completed.",
    "flushed_records": "Records made durable by those flushes.",
    "flush_us": "Microseconds from asking for each flush to its completion, summed.",
    "gated_waits": "Step attempts that waited for earlier records to be durable.",
    "gate_wait_us": "Microseconds step attempts waited at the durability gate, summed.",
    "steps_executed": "Step attempts run, their outcome recorded.",
    "steps_replayed": "Step outcomes replayed from the journal.",
    "checkpoints": "Checkpoints written.",
    "parks": "Runs parked: written to the run store and dropped from memory.",
    "determinism_errors": "Runs stopped because their code no longer matches their journal.",
    "busy_rejections": "Calls refused because the shard was too busy.",
}


class ShardMetrics:
    """The counters a shard keeps itself (the rest are read off its durability and steps:
    `Shard.metrics`)."""

    __slots__ = ("busy_rejections", "checkpoints", "determinism_errors", "parks", "steps_replayed")

    def __init__(self) -> None:
        self.steps_replayed = 0
        self.checkpoints = 0
        self.parks = 0
        self.determinism_errors = 0
        self.busy_rejections = 0  # nothing refuses a call as busy in this engine yet


def zeros() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)
