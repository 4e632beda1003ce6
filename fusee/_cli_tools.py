"""`fusee upgrade` and `fusee reshard`: tools that rewrite a closed data directory
(docs/operations.md). Both live in the fusee-server distribution, which is imported
inside each command, as for `inspect`."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import fusee
from fusee._cli_common import EXIT_OK, SERVER_MISSING, Stop


def register(commands: Any) -> None:
    upgrade = commands.add_parser(
        "upgrade",
        allow_abbrev=False,
        help="convert a closed data directory an earlier release wrote to this release's format",
        description="Convert a data directory written by an earlier release (its fusee.meta names "
        "the format) to the format this release writes, in place. The directory must be closed: "
        "stop the engine or server first. A crash at any point leaves a directory that opens as "
        "before, opens converted, or is finished by running the command again.",
    )
    upgrade.add_argument("dir", type=Path, help="the data directory (holds fusee.meta)")
    upgrade.set_defaults(run=_run_upgrade)

    reshard = commands.add_parser(
        "reshard",
        allow_abbrev=False,
        help="change a closed data directory's shard count",
        description="Move every run of a closed data directory to the shard its ID hashes to under "
        "a new shard count, growing or shrinking. Needs free space for a copy of the run stores. A "
        "crash at any point leaves a directory that opens with the old count, opens with the new "
        "one, or is finished by running the command again.",
    )
    reshard.add_argument("dir", type=Path, help="the data directory (holds fusee.meta)")
    reshard.add_argument("--shards", type=int, required=True, help="the new shard count (1 to 256)")
    reshard.set_defaults(run=_run_reshard)


def _run_upgrade(args: argparse.Namespace) -> int:
    report = _tool(args.dir, "upgrade", args.dir)
    print("\n".join(report.lines()))
    return EXIT_OK


def _run_reshard(args: argparse.Namespace) -> int:
    report = _tool(args.dir, "reshard", args.dir, args.shards)
    print("\n".join(report.lines()))
    return EXIT_OK


def _tool(root: Path, name: str, *args: Any) -> Any:
    """Run `fusee_server.<name>.<name>(*args)`; its refusal is the command's one line."""
    if not root.is_dir():
        raise Stop(f"{root} {'does not exist' if not root.exists() else 'is not a directory'}")
    try:
        module = importlib.import_module(f"fusee_server.{name}")
    except ImportError:
        raise Stop(SERVER_MISSING) from None
    try:
        return getattr(module, name)(*args)
    except (fusee.FuseeError, OSError) as error:
        raise Stop(str(error)) from None
