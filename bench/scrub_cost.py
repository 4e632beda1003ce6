"""What the scrub of every sector of a log's chain costs (`fusee inspect`, `fusee doctor`),
per GiB of log. Run on demand: `python bench/scrub_cost.py [--dir PARENT] [--mib N]`
(not a timed test; about a minute at 1 GiB, most of it writing the logs).

Writes two logs of `--mib` MiB each in fresh directories under `--dir` (default: the
current directory), with the native log and no checkpoint, so the whole log is the live
chain, and removes them afterwards:
- large batches (1 MiB of records each): the scrub is a checksum per sector of records;
- small batches (one 100-byte record each, one block on disk): seven of a batch's eight
  sectors are padding, which recovery does not read and the open's scrub checks.
For each it prints the scrub's own time (`inspect`'s `scrub.ms`, the segments already in
memory), the whole inspect (reading the files, from the page cache, recovery, the
scrub), and the log's open (which reads every segment and scrubs only the padding).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from fusee_server import _native

SHARDS = 1


def build(root: Path, total: int, batch_bytes: int, record_bytes: int) -> None:
    _native.Directory(root, shards=SHARDS).release()
    log = _native.Log(root / "wal", SHARDS, segment_bytes_min=64 << 20)
    record = b"x" * record_bytes
    per_batch = max(1, batch_bytes // (record_bytes + 4))
    written = 0
    while written < total:
        log.stage_many(0, [record] * per_batch)
        log.write()
        written += -(-(64 + 16 + per_batch * (record_bytes + 4)) // 4096) * 4096


def measure(root: Path, label: str) -> None:
    began = time.perf_counter()
    report = json.loads(_native.inspect(root))
    inspect_s = time.perf_counter() - began
    scrub = report["scrub"]
    assert report["error"] is None and not scrub["damaged"], report["error"]
    began = time.perf_counter()
    _native.Log(root / "wal", SHARDS)
    open_s = time.perf_counter() - began
    gib = scrub["bytes"] / (1 << 30)
    print(
        f"{label}: {scrub['bytes'] >> 20} MiB in {report['log']['batches']} batches; scrub "
        f"{scrub['ms']:.0f} ms ({scrub['ms'] / gib:.0f} ms per GiB); inspect {inspect_s * 1000:.0f} ms; "
        f"the log's open {open_s * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--dir", type=Path, default=Path("."), help="where to write the logs")
    parser.add_argument("--mib", type=int, default=1024, help="MiB of log per case (default 1024)")
    args = parser.parse_args()
    for label, batch, record in (("large batches", 1 << 20, 16 << 10), ("small batches", 100, 100)):
        scratch = Path(tempfile.mkdtemp(prefix="scrub-cost-", dir=args.dir))
        try:
            build(scratch / "data", args.mib << 20, batch, record)
            measure(scratch / "data", label)
        finally:
            shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
