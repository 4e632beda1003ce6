"""`fusee doctor DIR`: each check a data directory's health depends on, with a verdict.

The checks, in the order they run: the directory opens (the refusal `fusee inspect`
reports), the scrub of every sector of the log's chain (damage no open refuses: padding
after a batch's records), free space on its filesystem, the backup's lag, and whether the
disk honours flushes (`fusee disk-check`'s figures). Read only, like `inspect`: no lock is
taken and nothing in the directory is written, so it runs on a directory an engine or a
server has open. The disk check's scratch file goes in a temporary folder beside the
directory (inside it only when the directory is a mount point or its parent is not
writable), removed afterwards.

Exit codes: 0 every check OK, 1 any FAIL, 3 WARN without FAIL; 2, as every `fusee`
command, for what is no data directory, bad arguments, or fusee-server missing (so 2
cannot mean WARN).
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fusee
from fusee._cli_common import EXIT_DAMAGED, EXIT_OK
from fusee._cli_common import seconds as _seconds
from fusee._cli_common import size as _size

EXIT_WARN = 3

# A 4 KiB write made durable reaches stable media in tens of microseconds at best (an
# NVMe drive whose cache survives power loss), in milliseconds without such a cache.
# Faster than this, the flush stopped in memory: tmpfs, or a cache that ignores flushes
# (a drive, a RAID controller, a VM's disk), and an acknowledged record may not survive a
# power loss. A heuristic: it cannot tell an honest fast drive from a VM's cache above it.
FLUSH_P50_MIN_US = 10.0

SEGMENT_BYTES_MAX = 64 << 20  # the log's largest segment (LogOptions::segment_bytes_max)
FREE_FRACTION_MIN = 0.10
SECTORS_NAMED_MAX = 5  # a FAIL line names this many damaged sectors; inspect lists all


class Verdict(enum.Enum):
    """A check's outcome; the worst one sets the exit code."""

    OK = "OK"  # nothing to do
    WARN = "WARN"  # works today; look into it (exit 3 when nothing fails)
    FAIL = "FAIL"  # acknowledged data is at risk or unreadable, or the next write may fail


@dataclass
class Check:
    name: str
    verdict: Verdict
    summary: str
    details: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "summary": self.summary,
            "details": self.details,
            **self.figures,
        }


def register(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        allow_abbrev=False,
        help="check a data directory's health: opens, scrub, free space, backup, disk (reads only)",
        description="Run each check a data directory's health depends on and give each OK, WARN or "
        "FAIL: the directory opens (as `fusee inspect` judges it), the scrub of every sector of the "
        "log (damaged padding after a batch's records: FAIL, though the directory still opens), free "
        f"space on its filesystem (WARN below {FREE_FRACTION_MIN:.0%} or below twice the largest "
        f"segment, FAIL below {SEGMENT_BYTES_MAX >> 20} MiB), the backup's lag, and the disk's flush "
        f"latency (WARN when the p50 is below {FLUSH_P50_MIN_US:g} us: flushes reach no stable medium). "
        "Reads only and takes no lock: the directory may be open in another process. Exits 0 when "
        "every check is OK, 1 on any FAIL, 3 on WARN without FAIL, 2 when DIR is no data directory.",
    )
    doctor.add_argument("dir", type=Path, help="the data directory (holds fusee.meta)")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument(
        "--seconds",
        type=_seconds,
        default=2.0,
        help="how long the disk check measures flushes (default 2)",
    )
    doctor.set_defaults(run=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    # fusee._cli registers this module at its import: taken here, once it is complete.
    from fusee import _cli

    root: Path = args.dir
    _raw, report = _cli.inspect_report(root)
    native = _cli._native()
    checks = [
        check_opens(report),
        check_scrub(report),
        check_space(root),
        check_backup(root),
        check_disk(root, args.seconds, native.disk_check, _cli.latency_figures),
    ]
    worst = max((c.verdict for c in checks), key=list(Verdict).index)
    code = {Verdict.OK: EXIT_OK, Verdict.WARN: EXIT_WARN, Verdict.FAIL: EXIT_DAMAGED}[worst]
    if args.json:
        body = {c.name: c.as_json() for c in checks}
        print(json.dumps({"dir": str(root), "verdict": worst.value, "exit": code, "checks": body}))
    else:
        print("\n".join(doctor_lines(root, checks, worst)))
    return code


def doctor_lines(root: Path, checks: Sequence[Check], worst: Verdict) -> list[str]:
    lines = [f"{root}: {worst.value}"]
    for c in checks:
        lines.append(f"  {c.verdict.value:<4}  {c.name:<7} {c.summary}")
        for detail in c.details:
            lines += textwrap.wrap(detail, 96, initial_indent=" " * 16, subsequent_indent=" " * 18)
    return lines


def check_opens(report: dict[str, Any]) -> Check:
    """The refusal an open would give, from the same checks in the same order."""
    error = report.get("error")
    if error is not None:
        return Check("opens", Verdict.FAIL, "an open refuses the directory", [error], {"error": error})
    log = report["log"]
    summary = (
        f"opens: {report['shards']} shards, {log['batches']} batches in the log's chain, "
        f"next batch {log['next_seq']}"
    )
    return Check("opens", Verdict.OK, summary, figures={"error": None})


def check_scrub(report: dict[str, Any]) -> Check:
    """FAIL on any damaged sector of the chain: padding damage opens (no record lies in
    padding), but it is the first sign of a failing disk."""
    scrub: dict[str, Any] | None = report.get("scrub")
    if scrub is None:
        return Check("scrub", Verdict.FAIL, "not run: the log's chain cannot be followed (see opens)")
    figures = {k: scrub[k] for k in ("sectors", "bytes", "ms", "damaged", "unwritten")}
    checked = f"{scrub['sectors']} sectors ({_size(scrub['bytes'])}) checked in {scrub['ms']:.2f} ms"
    damaged: list[dict[str, Any]] = scrub["damaged"]
    if damaged:
        details = [sector_line(f) for f in damaged[:SECTORS_NAMED_MAX]]
        if len(damaged) > SECTORS_NAMED_MAX:
            details.append(f"and {len(damaged) - SECTORS_NAMED_MAX} more (fusee inspect lists every one)")
        sectors = "1 damaged sector" if len(damaged) == 1 else f"{len(damaged)} damaged sectors"
        summary = f"{sectors} of {checked}; the disk may be failing"
        return Check("scrub", Verdict.FAIL, summary, details, figures)
    summary = f"no damage: {checked}"
    if scrub["unwritten"]:
        summary += f"; {len(scrub['unwritten'])} padding sectors a crash left unwritten (harmless)"
    return Check("scrub", Verdict.OK, summary, figures=figures)


def sector_line(finding: dict[str, Any]) -> str:
    """A sector the scrub found, by segment file and offset (inspect's WARNING lines too)."""
    return f"wal/{finding['file']} offset {finding['offset']}: {finding['what']}"


def scrub_warnings(scrub: dict[str, Any] | None) -> list[str]:
    """`fusee inspect`'s WARNING line per damaged sector: the directory still opens (no
    record lies in padding), so inspect exits 0, but the disk may be failing."""
    if scrub is None:
        return []
    return [
        f"  WARNING: {sector_line(f)}; no acknowledged record is lost, but the disk may be failing"
        for f in scrub["damaged"]
    ]


def scrub_summary(scrub: dict[str, Any] | None) -> list[str]:
    """`fusee inspect`'s line of what the scrub checked, and of a crash's unwritten padding."""
    if scrub is None:
        return []
    lines = [
        f"  scrub: {scrub['sectors']} sectors ({_size(scrub['bytes'])}) of the chain checked, padding "
        f"included: {len(scrub['damaged'])} damaged"
    ]
    if scrub["unwritten"]:
        lines.append(
            f"  scrub: {len(scrub['unwritten'])} padding sectors were never written "
            "(a crash cut a write after its batch's records landed; harmless)"
        )
    return lines


def check_space(root: Path) -> Check:
    """FAIL below one segment of the largest size (the next roll may need one); WARN below
    10 % of the filesystem or below twice the directory's largest segment (segments double
    up to 64 MiB)."""
    stats = os.statvfs(root)
    free = stats.f_bavail * stats.f_frsize
    total = stats.f_blocks * stats.f_frsize
    sizes = [p.stat().st_size for p in (root / "wal").glob("*.wal")] if (root / "wal").is_dir() else []
    largest = max(sizes, default=0)
    fraction = free / total if total else 0.0
    figures = {"free_bytes": free, "total_bytes": total, "largest_segment_bytes": largest}
    summary = f"{_size(free)} free of {_size(total)} ({fraction:.0%}); largest segment {_size(largest)}"
    if free < SEGMENT_BYTES_MAX:
        return Check(
            "space", Verdict.FAIL, summary + f": below {SEGMENT_BYTES_MAX >> 20} MiB", figures=figures
        )
    if fraction < FREE_FRACTION_MIN or free < 2 * largest:
        why = (
            f"below {FREE_FRACTION_MIN:.0%}"
            if fraction < FREE_FRACTION_MIN
            else "below twice the largest segment"
        )
        return Check("space", Verdict.WARN, f"{summary}: {why}", figures=figures)
    return Check("space", Verdict.OK, summary, figures=figures)


BACKUP_LAG_WARN_S = 300.0


def check_backup(root: Path) -> Check:
    """The continuous backup (docs/backup.md), from the directory's `backup.json` and the
    target's manifest: how old the newest restore point is. WARN past BACKUP_LAG_WARN_S
    (a directory closed that long is simply idle: the verdict says so) or when the target
    does not answer; FAIL when its manifest is damaged."""
    import json

    try:
        state = json.loads((root / "backup.json").read_text())
    except (FileNotFoundError, ValueError):
        return Check("backup", Verdict.OK, "no backup configured", figures={"configured": False})
    url = str(state.get("target"))
    try:
        from fusee_server.backup import manifest as M
        from fusee_server.backup.targets import target

        manifest = M.load(target(url))
    except ImportError:
        return Check("backup", Verdict.WARN, f"backup to {url}: cannot be read without fusee-server")
    except fusee.IoError as error:
        return Check("backup", Verdict.FAIL, f"backup to {url}: {error}")
    except Exception as error:  # noqa: BLE001 - an unreachable target in any of its ways
        return Check("backup", Verdict.WARN, f"backup to {url}: the target does not answer ({error})")
    timeline = manifest.timeline(str(state.get("timeline"))) if manifest is not None else None
    if timeline is None or not timeline.points:
        return Check("backup", Verdict.WARN, f"backup to {url}: no restore point of this directory there yet")
    lag_s = time.time() - timeline.points[-1].at_ms / 1000
    figures: dict[str, Any] = {
        "configured": True,
        "target": url,
        "lag_s": round(lag_s, 3),
        "points": len(timeline.points),
    }
    summary = f"backup to {url}: newest restore point {lag_s:.0f} s ago ({len(timeline.points)} points)"
    if lag_s > BACKUP_LAG_WARN_S:
        return Check(
            "backup",
            Verdict.WARN,
            summary + " (behind, unless the directory was idle since)",
            figures=figures,
        )
    return Check("backup", Verdict.OK, summary, figures=figures)


DiskCheck = Callable[[str, float], tuple[list[int], bool]]
Figures = Callable[[Sequence[int]], dict[str, Any]]


def check_disk(root: Path, seconds: float, disk_check: DiskCheck, figures_of: Figures) -> Check:
    """`fusee disk-check`'s measure, judged by `flush_verdict`."""
    try:
        with tempfile.TemporaryDirectory(prefix=".fusee-doctor-", dir=scratch_parent(root)) as scratch:
            latencies_ns, direct = disk_check(scratch, seconds)
    except OSError as error:
        return Check("disk", Verdict.WARN, f"cannot measure the flush latency: {error}")
    figures = {**figures_of(latencies_ns), "direct": direct, "seconds": seconds}
    verdict, why = flush_verdict(figures["p50_us"])
    how = "O_DIRECT" if direct else "buffered + flush"
    summary = (
        f"flush p50 {figures['p50_us']:.1f} us, p99 {figures['p99_us']:.1f} us "
        f"({figures['count']} durable 4 KiB writes, {how}): {why}"
    )
    return Check("disk", verdict, summary, figures=figures)


def flush_verdict(p50_us: float) -> tuple[Verdict, str]:
    """Whether a flush p50 is one a device that honours flushes can give."""
    if p50_us < FLUSH_P50_MIN_US:
        return Verdict.WARN, (
            f"faster than a durable write can be (below {FLUSH_P50_MIN_US:g} us): flushes stop in memory "
            "(tmpfs, or a cache that ignores them), and acknowledged records may not survive a power loss"
        )
    return Verdict.OK, "a flush a device that honours flushes can give"


def scratch_parent(root: Path) -> Path:
    """Where the disk check's scratch folder goes: beside `root` on the same filesystem, so
    the directory is left as found; inside it only when it is a mount point (its parent is
    another disk) or its parent is not writable."""
    parent = root.resolve().parent
    try:
        same_disk = parent.stat().st_dev == root.stat().st_dev
    except OSError:
        return root
    return parent if same_disk and os.access(parent, os.W_OK) else root
