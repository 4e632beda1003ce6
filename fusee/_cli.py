"""The `fusee` command: tools that look at a data directory and at the disk under it.

The disk-side tools live in the fusee-server distribution's Rust extension. It is
imported inside each command, never at module level, so that `fusee --help` and
`fusee --version` work on a machine that has only the `fusee` distribution, and a
command that needs the extension says how to install it instead of failing on an
import at startup.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import fusee
from fusee import _cli_backup, _cli_doctor, _cli_journal, _cli_objects, _cli_runs, _cli_tools
from fusee._cli_common import ADDRESS_HELP, EXIT_DAMAGED, EXIT_OK
from fusee._cli_common import Stop as _Stop
from fusee._cli_common import seconds as _seconds
from fusee._cli_common import size as _size
from fusee._cli_common import table as _table
from fusee._cli_common import with_client as _with_client

DISK_CHECK_SECONDS = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    try:
        code: int = args.run(args)
    except _Stop as stop:
        print(f"fusee {args.command}: {stop}", file=sys.stderr)
        return stop.code
    except BrokenPipeError:
        # `fusee inspect dir | head`: the reader left; say nothing more.
        sys.stderr.close()
        return EXIT_OK
    return code


def _parser() -> argparse.ArgumentParser:
    # No parser here takes abbreviations: `--invoke-secret` must not be read as
    # `--invoke-secret-file`, nor a misspelt option as some other one.
    parser = argparse.ArgumentParser(
        prog="fusee",
        description="Tools for Fusee data directories and servers.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"fusee {fusee.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="<command>")

    inspect = commands.add_parser(
        "inspect",
        allow_abbrev=False,
        help="report a data directory's log segments and checkpoints (reads only)",
        description="Report a data directory's shared log (segments, batch ranges, records per "
        "shard, what lies at the log's end, spares) and each shard's checkpoints, after the checks an "
        "open makes. Reads only: the directory may be open in another process. Exits 1 when an open "
        "would refuse the directory (acknowledged records damaged or lost), naming the file.",
    )
    inspect.add_argument("dir", type=Path, help="the data directory (holds fusee.meta)")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(run=_run_inspect)

    disk = commands.add_parser(
        "disk-check",
        allow_abbrev=False,
        help="measure the flush latency of the disk under a directory",
        description="Time durable 4 KiB writes, as the log makes them, in a scratch file under DIR "
        "(removed afterwards), and report the latency distribution.",
    )
    disk.add_argument("dir", type=Path, help="a directory on the disk to measure")
    disk.add_argument(
        "seconds",
        type=_seconds,
        nargs="?",
        default=DISK_CHECK_SECONDS,
        help=f"how long to measure (default {DISK_CHECK_SECONDS:g})",
    )
    disk.add_argument("--json", action="store_true", help="print the figures as JSON")
    disk.set_defaults(run=_run_disk_check)

    invocations = commands.add_parser(
        "invocations",
        allow_abbrev=False,
        help="a server's invoker: invocations per endpoint and how they ended, shards due",
        description="Ask a fusee server for its invocation metrics (the `invocations` call) and print "
        "them as a table: per endpoint the invocations sent and how they ended, in flight, backoff, "
        "time to answer, shards invoked, steps run, concurrency in force; overall the shards due, "
        "invoking, in backoff and overdue.",
    )
    invocations.add_argument("address", help=ADDRESS_HELP)
    invocations.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    invocations.set_defaults(run=_run_invocations)

    schedules = commands.add_parser(
        "schedules",
        allow_abbrev=False,
        help="a server's schedules: list, pause, resume, trigger, delete (docs/schedules.md)",
        description="List a fusee server's schedules as a table (or JSON), or pause, resume, "
        "trigger or delete one by name. Runs a deleted schedule started keep running.",
    )
    schedules.add_argument("action", choices=SCHEDULE_ACTIONS, help="what to do")
    schedules.add_argument("address", help=ADDRESS_HELP)
    schedules.add_argument("name", nargs="?", help="the schedule (all but ls)")
    schedules.add_argument("--json", action="store_true", help="print the answer as JSON")
    schedules.set_defaults(run=_run_schedules)

    _cli_runs.register(commands)
    _cli_objects.register(commands)
    _cli_journal.register(commands)
    _cli_tools.register(commands)
    _cli_backup.register(commands)
    _cli_doctor.register(commands)

    # Its options belong to the fusee-server distribution, which parses them itself.
    server = commands.add_parser(
        "server",
        help="run the central log server (fusee server --help for its options)",
        add_help=False,
        allow_abbrev=False,
        prefix_chars="\0",
    )
    server.add_argument("args", nargs=argparse.REMAINDER)
    server.set_defaults(run=_run_server)

    codec_server = commands.add_parser(
        "codec-server",
        help="decode encrypted payloads for the web UI, where the keys are (fusee codec-server --help)",
        add_help=False,
        allow_abbrev=False,
        prefix_chars="\0",
    )
    codec_server.add_argument("args", nargs=argparse.REMAINDER)
    codec_server.set_defaults(run=_run_codec_server)
    return parser


def _run_invocations(args: argparse.Namespace) -> int:
    metrics = _with_client(args.address, lambda client: client.call("invocations", {}))
    if args.json:
        print(json.dumps(metrics, indent=2))
        return EXIT_OK
    print("\n".join(_invocation_lines(metrics)))
    return EXIT_OK


SCHEDULE_ACTIONS = ("ls", "pause", "resume", "trigger", "delete")
SCHEDULE_COLUMNS = (
    ("name", "name"),
    ("workflow", "workflow"),
    ("when", "cron / every"),
    ("timezone", "time zone"),
    ("overlap", "overlap"),
    ("paused", "paused"),
    ("next", "next"),
    ("fired", "fired"),
    ("skipped", "skipped"),
    ("last_run", "last run"),
)


def _run_schedules(args: argparse.Namespace) -> int:
    if args.action != "ls" and not args.name:
        raise _Stop(f"{args.action} needs the schedule's name")

    async def act(client: Any) -> Any:
        if args.action == "ls":
            return await client.schedules.list()
        handle = client.schedules.get(args.name)
        if args.action == "trigger":
            return {"id": (await handle.trigger()).id}
        await getattr(handle, args.action)()
        return {"name": args.name, args.action: True}

    answer = _with_client(args.address, act)
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.action == "ls":
        print("\n".join(_schedule_lines(answer)))
    elif args.action == "trigger":
        print(f"started {answer['id']}")
    else:
        print(f"{args.name}: {args.action} done")
    return EXIT_OK


def _schedule_lines(described: list[dict[str, Any]]) -> list[str]:
    if not described:
        return ["no schedules"]
    header = [title for _, title in SCHEDULE_COLUMNS]
    rows = []
    for d in described:
        when = d["cron"] or f"every {d['every_ms']} ms"
        cells = {**d, "when": when, "paused": "yes" if d["paused"] else "no"}
        rows.append(["-" if cells.get(key) is None else str(cells[key]) for key, _ in SCHEDULE_COLUMNS])
    return _table(header, rows)


ENDPOINT_COLUMNS = (
    ("invocations", "sent"),
    ("succeeded", "ok"),
    ("failed", "failed"),
    ("timedOut", "timed out"),
    ("unleased", "no lease"),
    ("throttled", "throttled"),
    ("inFlight", "in flight"),
    ("failuresInARow", "failing"),
    ("backoffMs", "backoff ms"),
    ("answerMsP50", "answer ms p50"),
    ("maxMs", "answer ms max"),
    ("shards", "shards"),
    ("steps", "steps"),
    ("concurrency", "concurrency"),
    ("leadMs", "lead ms"),
)
OVERALL = (
    ("dueShards", "shards due"),
    ("scheduledShards", "shards due later (a timer)"),
    ("invokingShards", "shards invoking"),
    ("backoffShards", "shards in backoff"),
    ("overdue", "overdue (due over 1 s ago, not invoked)"),
    ("handbacks", "handbacks"),
    ("crashes", "left without reporting"),
    ("noProgress", "invocations without progress"),
    ("parkedCalls", "calls waiting at the server"),
)


def _invocation_lines(metrics: dict[str, Any]) -> list[str]:
    endpoints = metrics.get("endpoints", [])
    if not endpoints:
        return ["this server invokes no endpoint (start it with --invoke URL)"]
    header = ["endpoint", *(title for _, title in ENDPOINT_COLUMNS)]
    rows = [
        [e["url"], *("-" if e.get(key) is None else str(round(e[key], 1)) for key, _ in ENDPOINT_COLUMNS)]
        for e in endpoints
    ]
    lines = _table(header, rows)
    lines += [f"{e['url']}: last error: {e['lastError']}" for e in endpoints if e.get("lastError")]
    lines.append("")
    lines += [f"{title}: {metrics.get(key, 0)}" for key, title in OVERALL]
    return lines


def _run_server(args: argparse.Namespace) -> int:
    _native()  # says how to install fusee-server when it is missing
    from fusee_server import main as server

    parser = argparse.ArgumentParser(
        prog="fusee server", description="The central log server.", allow_abbrev=False
    )
    server.add_arguments(parser)
    code: int = server.run(parser.parse_args(args.args))
    return code


def _run_codec_server(args: argparse.Namespace) -> int:
    _native()
    from fusee_server import codec_server

    code: int = codec_server.main(args.args)
    return code


def _native() -> ModuleType:
    """The Rust extension, imported only when a command needs it."""
    try:
        from fusee_server import _native
    except ImportError:
        raise _Stop(
            "this command needs the fusee-server distribution: pip install fusee-server "
            "(in the Fusee repository: pip install ./server)"
        ) from None
    return _native


# -- inspect ----------------------------------------------------------------------------


def _run_inspect(args: argparse.Namespace) -> int:
    raw, report = inspect_report(args.dir)
    if args.json:
        print(raw)
    else:
        print("\n".join(_inspect_lines(report)))
    # Damage the scrub found in padding is a WARNING: the directory opens, nothing is lost.
    return EXIT_DAMAGED if report.get("error") is not None else EXIT_OK


def inspect_report(root: Path) -> tuple[str, dict[str, Any]]:
    """The native report of `root` (its JSON, and parsed), for `inspect` and `doctor`. Reads
    only; a missing directory, or one that is no Fusee data directory, is the command's
    one-line failure."""
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a Fusee data directory (no fusee.meta)"
        raise _Stop(f"{root} {what}")
    native = _native()
    try:
        # The same checks as an open, in the same order: whatever an open would refuse,
        # inspect reports as the directory's error (a missing or damaged fusee.meta too).
        raw: str = native.inspect(str(root))
    except OSError as error:
        raise _Stop(f"{root}: {error}") from None
    report: dict[str, Any] = json.loads(raw)
    return raw, report


def _inspect_lines(report: dict[str, Any]) -> list[str]:
    log: dict[str, Any] = report["log"]
    lines = [f"{report['dir']}: {report['shards']} shards"]
    error = report.get("error")
    if error is not None and "`fusee " in error:
        # Not damage: an earlier release's format, or a tool's swap to finish.
        lines += [
            "  REFUSED until a tool runs (nothing is damaged); opening this directory fails with:",
            *textwrap.wrap(error, 96, initial_indent="    ", subsequent_indent="    "),
        ]
    elif error is not None:
        lines += [
            "  DAMAGED: acknowledged records are lost or unreadable; opening this directory fails with:",
            *textwrap.wrap(error, 96, initial_indent="    ", subsequent_indent="    "),
        ]
    lines += _cli_doctor.scrub_warnings(report.get("scrub"))
    lines += ["", "log (wal/)"]
    if log.get("error") is not None:
        lines.append("  the chain cannot be followed (see above)")
    else:
        segments: list[dict[str, Any]] = log["segments"]
        for seg in segments:
            lines += _segment_lines(seg)
        lines += [
            f"  chain: {_count(log['batches'], 'batch', 'batches')}, next batch seq {log['next_seq']}, "
            f"ends at offset {log['end_offset']}: {TAILS[log['tail']]}; "
            f"{_count(log['spares'], 'spare segment', 'spare segments')}",
            *_per_shard("  records per shard: ", log["records_per_shard"]),
            *_cli_doctor.scrub_summary(report.get("scrub")),
        ]
        if log["unsealed"]:
            lines.append(
                f"  a roll was cut before its seal (written at the next open): {', '.join(log['unsealed'])}"
            )
    lines += ["", "checkpoints"]
    for shard in report["checkpoints"]:
        lines += _checkpoint_lines(shard)
    return lines


TAILS = {
    "clean": "nothing after it",
    "torn": "a torn tail (a flush cut by a crash, never acknowledged; discarded at open)",
    "stale": "stale bytes (a reused segment's earlier life; discarded at open)",
}


def _segment_lines(seg: dict[str, Any]) -> list[str]:
    batches: int = seg["batches"]
    span = f"batches {seg['first_seq']}..{seg['last_seq']} ({batches})" if batches else "no batches"
    flags = ["in chain"]
    if seg["tail"] != "clean":
        flags.append(TAILS[seg["tail"]])
    return [
        f"  {seg['file']}  id {seg['id']}  {_size(seg['bytes'])}  {span}  {', '.join(flags)}",
        *_per_shard("    records per shard: ", seg["records_per_shard"]),
    ]


def _checkpoint_lines(shard: dict[str, Any]) -> list[str]:
    files: list[dict[str, Any]] = shard["files"]
    head = f"  shard {shard['shard']:03d}"
    if not files:
        lines = [f"{head}  none"]
    else:
        lines = [head]
    for f in files:
        if f["intact"]:
            lines.append(
                f"    {f['file']}  position {f['position']}  run store prefix {f['runs_prefix']} B  "
                f"state {_size(f['bytes'])}  intact"
            )
        else:
            lines.append(f"    {f['file']}  DAMAGED (checksum or header does not match; skipped at open)")
    if shard.get("error") is not None:
        lines.append("    DAMAGED: see the error above")
    return lines


def _per_shard(prefix: str, counts: list[int]) -> list[str]:
    text = " ".join(f"{shard}:{n}" for shard, n in enumerate(counts))
    return textwrap.wrap(text, 100, initial_indent=prefix, subsequent_indent=" " * len(prefix))


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# -- disk-check -------------------------------------------------------------------------


def _run_disk_check(args: argparse.Namespace) -> int:
    root: Path = args.dir
    # The native check creates missing directories; a tool that only measures should not.
    if not root.is_dir():
        raise _Stop(f"{root} is not a directory")
    native = _native()
    try:
        latencies_ns, direct = native.disk_check(str(root), args.seconds)
    except OSError as error:
        raise _Stop(f"{root}: {error}") from None
    figures = latency_figures(latencies_ns)
    if args.json:
        print(json.dumps({"dir": str(root), "seconds": args.seconds, **figures, "direct": direct}))
        return EXIT_OK
    how = (
        "O_DIRECT writes carrying RWF_DSYNC"
        if direct
        else "buffered writes, each followed by a durable flush (the filesystem refused O_DIRECT)"
    )
    print(f"{root}: {figures['count']} durable 4 KiB writes in {args.seconds:g} s, {how}")
    for name in ("mean", "p50", "p90", "p99", "max"):
        print(f"  {name:<5} {figures[name + '_us']:>10.1f} us")
    return EXIT_OK


def latency_figures(latencies_ns: Sequence[int]) -> dict[str, Any]:
    """Count, mean and nearest-rank percentiles, in microseconds."""
    ordered = sorted(latencies_ns)
    if not ordered:
        raise _Stop("the disk check made no writes")

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)] / 1000

    return {
        "count": len(ordered),
        "mean_us": round(sum(ordered) / len(ordered) / 1000, 3),
        "p50_us": rank(0.50),
        "p90_us": rank(0.90),
        "p99_us": rank(0.99),
        "max_us": ordered[-1] / 1000,
    }
