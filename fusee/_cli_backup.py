"""`fusee backup`, `fusee backups` and `fusee restore`: a data directory's continuous
backup (docs/backup.md). The work is the fusee-server distribution's, imported inside each
command as for `inspect`."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fusee
from fusee._cli_common import EXIT_DAMAGED, EXIT_OK, SERVER_MISSING, Stop
from fusee._cli_common import table as _table

TARGET_HELP = "s3://bucket/prefix[?region=...&endpoint=...], file:///path or a directory"


def register(commands: Any) -> None:
    backup = commands.add_parser(
        "backup",
        allow_abbrev=False,
        help="back a closed data directory up to a target, once (docs/backup.md)",
        description="Open the closed data directory, upload everything the target lacks, record a "
        "restore point and close. For a continuous backup, open the engine with backup=TARGET or run "
        "fusee server --backup TARGET.",
    )
    backup.add_argument("dir", type=Path, help="the data directory")
    backup.add_argument("target", help=TARGET_HELP)
    backup.set_defaults(run=_run_backup)

    backups = commands.add_parser(
        "backups",
        allow_abbrev=False,
        help="list a backup target's timelines and restore points",
        description="List the timelines of a backup target and the restore points of each; with "
        "--verify, read every object the manifest names back against its checksum and name the "
        "damaged ones (exit 1).",
    )
    backups.add_argument("target", help=TARGET_HELP)
    backups.add_argument("--verify", action="store_true", help="read every object back and check it")
    backups.add_argument("--json", action="store_true", help="print the points as JSON")
    backups.set_defaults(run=_run_backups)

    restore = commands.add_parser(
        "restore",
        allow_abbrev=False,
        help="restore a backup to a point in time into a new directory",
        description="Write the newest restore point at or before --at (without it: the newest) into "
        "DIR, which must not exist or be empty. The directory opens as after a crash at that moment.",
    )
    restore.add_argument("target", help=TARGET_HELP)
    restore.add_argument("dir", type=Path, help="the directory to write")
    restore.add_argument(
        "--at", help="RFC 3339 (2026-12-07T10:00:00Z), Unix milliseconds, or -15m before now"
    )
    restore.add_argument("--timeline", help="only this timeline's points (fusee backups lists them)")
    restore.set_defaults(run=_run_restore)


def _server() -> Any:
    try:
        from fusee_server.backup import restore, targets
    except ImportError:
        raise Stop(SERVER_MISSING) from None
    return restore, targets


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _run_backup(args: argparse.Namespace) -> int:
    _, targets = _server()
    if not (args.dir / "fusee.meta").exists():
        raise Stop(f"{args.dir} is not a Fusee data directory (no fusee.meta)")

    async def go() -> None:
        engine = await fusee.Engine.open(str(args.dir), backup=args.target)
        await engine.close()  # the close makes the last upload and waits for it

    try:
        targets.target(args.target)
        asyncio.run(go())
    except fusee.FuseeError as error:
        raise Stop(str(error)) from None
    print(f"backed {args.dir} up to {args.target}")
    return EXIT_OK


def _run_backups(args: argparse.Namespace) -> int:
    restore, targets = _server()
    from fusee_server.backup import manifest as M

    try:
        target = targets.target(args.target)
        manifest = M.load(target)
        if manifest is None:
            raise Stop(f"{args.target}: no backup there (no manifest.json)")
        plans = restore.points(manifest)
        bad = restore.verify(target) if args.verify else []
    except (fusee.FuseeError, OSError) as error:
        raise Stop(str(error)) from None
    rows = [
        [p.timeline.id, _stamp(p.point.at_ms), str(p.point.at_ms), str(sum(p.point.positions))] for p in plans
    ]
    if args.json:
        listed = [
            {
                "timeline": p.timeline.id,
                "at": _stamp(p.point.at_ms),
                "atMs": p.point.at_ms,
                "positions": p.point.positions,
            }
            for p in plans
        ]
        print(json.dumps({"shards": manifest.shards, "points": listed, "damaged": bad}))
    else:
        print(
            f"{args.target}: {manifest.shards} shards, {len(manifest.timelines)} timelines, {len(plans)} restore points"
        )
        if rows:
            print("\n".join(_table(["TIMELINE", "AT", "UNIX MS", "RECORDS"], rows)))
        if args.verify:
            print("verify: every object reads back intact" if not bad else "verify: DAMAGED")
            for line in bad:
                print(f"  {line}")
    return EXIT_DAMAGED if bad else EXIT_OK


def _run_restore(args: argparse.Namespace) -> int:
    restore, targets = _server()
    try:
        at = restore.parse_time(args.at) if args.at is not None else None
        chosen = restore.restore(targets.target(args.target), args.dir, at, args.timeline)
    except (fusee.FuseeError, OSError) as error:
        raise Stop(str(error)) from None
    print(f"restored {args.dir} to {_stamp(chosen.point.at_ms)} (timeline {chosen.timeline.id})")
    return EXIT_OK
