"""`fusee export`, `fusee show`, `fusee replay-check` and `fusee versions`: journals out of
a data directory or a server, read, and replayed against new code before a deploy
(docs/engine.md, *Exporting journals*).

An export is a JSON document per run (`.fjnl`), written by `fusee.engine.replay`'s
`export_document`, the same as `engine.export_journal(id)` returns. A data directory is
never opened in place: it may be in use, and an open writes (recovery, a checkpoint).
It is copied, its checkpoints first, then its run stores, then the log, so the copy is
what a crash at the end of the copy would have left, and the copy is opened (recovered)
and read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import fusee
from fusee import journal as R
from fusee._cli_common import EXIT_OK, EXIT_PARTIAL, Stop, table
from fusee._cli_runs import TARGET_HELP, _opened, _shown
from fusee._errors import SettingError
from fusee._sealing import aes_gcm, keys_file
from fusee.engine import replay as exports

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0
BUILT_IN = "fusee."  # schedules, debounce and batch coordinators...: native code, left out
COPY_ORDER = ("fusee.meta", "*.fck", "runs-*.dat")  # then everything else (the log)


def register(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        allow_abbrev=False,
        help="write runs' journals to .fjnl files, for fusee show and replay-check",
        description="Write one run's journal (ID), or a sample of the most recent runs whose "
        "whole journal is kept (--sample N), as .fjnl files. A data directory is copied first "
        "and the copy opened, so the application may keep running on it.",
    )
    export.add_argument("target", help=TARGET_HELP)
    export.add_argument("id", nargs="?", help="the run to export (or --sample)")
    export.add_argument(
        "--sample", type=_count, metavar="N", help="the N most recent runs with whole journals"
    )
    export.add_argument(
        "-o", "--output", type=Path, help="the file (one run; default: stdout) or directory (--sample)"
    )
    export.set_defaults(run=_run(_export))

    show = commands.add_parser(
        "show",
        allow_abbrev=False,
        help="print an exported journal (.fjnl)",
        description="Print an exported journal: the run, then one line per record.",
    )
    show.add_argument("file", type=Path, help="a .fjnl file (fusee export, engine.export_journal)")
    show.add_argument("--json", action="store_true", help="print the document as JSON")
    show.set_defaults(run=lambda args: _show(args))

    check = commands.add_parser(
        "replay-check",
        allow_abbrev=False,
        help="replay exported journals against the code, naming the first difference",
        description="Replay each exported journal against the workflows the modules define, "
        "running no step and no timer, and name the first difference for each run the code "
        "would leave stuck. Exit 1 when any would.",
    )
    check.add_argument("paths", nargs="+", type=Path, help=".fjnl files, or directories holding them")
    check.add_argument(
        "--module",
        action="append",
        required=True,
        help="a module defining the workflows (dotted name, or a .py file); repeat for several",
    )
    check.add_argument(
        "--keys-file",
        type=Path,
        help="the keys of journals exported encrypted: lines of '<key ID> <64 hex digits>'",
    )
    check.set_defaults(run=lambda args: _replay_check(args))

    versions = commands.add_parser(
        "versions",
        allow_abbrev=False,
        help="live runs per workflow type and version: when a version has none, delete its code",
        description="Count the runs that have not ended, per workflow type and the version "
        "each started under (docs/engine.md, *Exporting journals*).",
    )
    versions.add_argument("target", help=TARGET_HELP)
    versions.add_argument("--json", action="store_true", help="print the counts as JSON")
    versions.set_defaults(run=_run(_versions))


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} runs: give at least 1")
    return value


def _run(act: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = asyncio.run(act(args))
        except fusee.FuseeError as error:  # a refused call (no such run...): one line
            raise Stop(error.message) from None
        return code

    return run


async def _within(call: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(call, CALL_TIMEOUT_S)
    except TimeoutError:
        raise Stop(f"no answer about {what} within {CALL_TIMEOUT_S:g} s") from None


# -- export -----------------------------------------------------------------------------


@asynccontextmanager
async def _source(target: str) -> AsyncIterator[Any]:
    """An engine on a copy of the data directory `target`, or a client of the server."""
    path = Path(target)
    if not path.is_dir():
        async with _opened(target, CALL_TIMEOUT_S) as client:
            yield client
        return
    if not (path / "fusee.meta").exists():
        raise Stop(f"{path} is not a Fusee data directory (no fusee.meta)")
    with tempfile.TemporaryDirectory(prefix="fusee-export-") as scratch:
        copy = Path(scratch) / "data"
        copy_directory(path, copy)
        async with _opened(str(copy), CALL_TIMEOUT_S) as engine:
            yield engine


def copy_directory(source: Path, copy: Path) -> None:
    """Copy a data directory that may be in use: checkpoints, then run stores, then the
    log. A checkpoint names run-store offsets and a log position; whatever is copied
    after it is at least that long, so the copy recovers as after a crash. The lock file
    is not copied (the copy is nobody's)."""
    copy.mkdir(parents=True)
    files = [p for p in source.rglob("*") if p.is_file() and p.name != "fusee.lock"]
    first = [p for pattern in COPY_ORDER for p in files if p.match(pattern)]
    for file in [*dict.fromkeys(first), *(p for p in files if p not in first)]:
        target = copy / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(file, target)
        except FileNotFoundError:
            continue  # a log segment retired while we copied: a newer checkpoint covers it
        except OSError as error:
            raise Stop(f"cannot copy {file}: {error.strerror or error}") from None


async def _export(args: argparse.Namespace) -> int:
    if args.id is not None and args.sample is not None:
        raise Stop("give a run's ID or --sample N, not both")
    if args.id is None and args.sample is None:
        raise Stop("give a run's ID, or --sample N")
    if args.sample is not None and args.output is None:
        raise Stop("--sample writes one file per run: give the directory with -o")
    async with _source(args.target) as api:
        if args.id is not None:
            document = await _within(_exported(api, args.id), f"run '{args.id}'")
            if document is None:
                raise Stop(f"run '{args.id}' kept no whole journal to export")
            text = json.dumps(document, indent=1)
            if args.output is None:
                print(text)
            else:
                _write(args.output, text)
                print(f"{args.id}: {len(document['journal'])} records to {args.output}", file=sys.stderr)
            return EXIT_OK
        documents = await _within(_sample(api, args.sample), "the sample")
    args.output.mkdir(parents=True, exist_ok=True)
    for document in documents:
        _write(args.output / export_name(document["id"]), json.dumps(document, indent=1))
    print(f"{len(documents)} journals to {args.output}", file=sys.stderr)
    return EXIT_OK


def export_name(wid: str) -> str:
    """A run's file name: its ID quoted, so any ID (slashes, dots) is one plain file."""
    return urllib.parse.quote(wid, safe="-_@=+,") + exports.EXPORT_SUFFIX


async def _exported(api: Any, wid: str) -> dict[str, Any] | None:
    described = await api.run(wid).describe()
    if not exports.whole(described.journal):
        return None
    document = exports.export_document(described.summary, described.journal)
    if document["status"] == "waiting_for_code":
        # The copy is opened without code: in the application the run is running.
        document["status"] = "running"
    return document


async def _sample(api: Any, count: int) -> list[dict[str, Any]]:
    """The `count` most recent runs (by their start) whose whole journal is kept: every
    run not ended, and ended ones within their retention."""
    documents = []
    async for row in api.list():
        if row.type.startswith(BUILT_IN):
            continue
        document = await _exported(api, row.id)
        if document is not None:
            documents.append(document)
    documents.sort(key=lambda d: (d["journal"][0].get("now", 0), d["id"]), reverse=True)
    return documents[:count]


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n")
    except OSError as error:
        raise Stop(f"cannot write {path}: {error.strerror or error}") from None


# -- show and replay-check --------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    try:
        document = exports.read_export(path)
    except fusee.FuseeError as error:
        raise Stop(error.message) from None
    return document


def _show(args: argparse.Namespace) -> int:
    document = _read(args.file)
    try:
        exports.records_of(document, args.file)  # rows that are not records: said, as replay-check says it
    except fusee.FuseeError as error:
        raise Stop(error.message) from None
    if args.json:
        print(json.dumps(document, indent=1))
        return EXIT_OK
    journal = document["journal"]
    print(
        f"{document['id']}  run {document['run']}  type {document.get('type', '?')}  "
        f"{document.get('status', '?')}"
    )
    print(f"journal: {len(journal)} records")
    for i, row in enumerate(journal):
        kind = row.get("kind", "?") if isinstance(row, dict) else "?"
        fields = (
            " ".join(f"{k}={_shown(v)}" for k, v in row.items() if k != "kind")
            if isinstance(row, dict)
            else ""
        )
        print(f"{i:>5}  {kind:<15} {fields}".rstrip())
    return EXIT_OK


def _replay_check(args: argparse.Namespace) -> int:
    workflows = _workflows(args.module)
    replayer = exports.Replayer(workflows, _codec(args.keys_file))
    # Each difference is printed below, once: not also as the engine's stuck-run warning.
    logging.getLogger("fusee").disabled = True
    files: list[Path] = []
    for path in args.paths:
        if path.is_dir():
            found = sorted(path.rglob(f"*{exports.EXPORT_SUFFIX}"))
            if not found:
                raise Stop(f"{path}: no exported journals (*{exports.EXPORT_SUFFIX}) there")
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise Stop(f"{path}: no such file or directory")
    outcomes = [replayer.check_file(file) for file in files]
    stuck = [o for o in outcomes if o.readable and not o.ok and not o.ended]
    differ = [o for o in outcomes if o.readable and not o.ok and o.ended]
    unreadable = [o for o in outcomes if not o.readable]
    for o in outcomes:
        if not o.readable:
            print(f"ERROR    {o.error}")
        elif o.ok:
            print(f"ok       {o.workflow_id}")
        elif o.ended:
            print(f"DIFFERS  {o.workflow_id} (ended {o.status}; a retry or reset would meet it): {o.error}")
        else:
            print(f"STUCK    {o.workflow_id}: {o.error}")
    print(
        f"{len(outcomes)} journals: {sum(o.ok for o in outcomes)} match the code, {len(stuck)} would be stuck, "
        f"{len(differ)} ended runs differ, {len(unreadable)} unreadable"
    )
    if stuck:
        print(
            "a run that would be stuck needs one of: code that matches (ctx.version, a new version=), "
            "the change behind ctx.patched(id), or a reset before the step that differs",
            file=sys.stderr,
        )
    return EXIT_PARTIAL if stuck or unreadable else EXIT_OK


def _codec(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return aes_gcm(keys_file(path.read_text(), str(path)))
    except OSError as error:
        raise Stop(f"--keys-file {path}: {error.strerror or error}") from None
    except fusee.FuseeError as error:
        raise Stop(f"--keys-file: {error.message}") from None


def _workflows(modules: list[str]) -> list[Any]:
    """The workflows of `--module`s: dotted names (from the current directory too, as
    `python -m` finds them) or .py files."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    names = []
    for module in modules:
        path = Path(module)
        if path.suffix == ".py":
            if not path.is_file():
                raise Stop(f"--module {module}: no such file")
            sys.path.insert(0, str(path.resolve().parent))
            names.append(path.stem)
        else:
            names.append(module)
    from handlers import import_workflows

    try:
        return import_workflows(",".join(names), "--module")
    except SettingError as error:
        hint = (
            " (a dotted name is imported from the current directory: run from the one that holds it, "
            "or give the module's .py path)"
            if "ModuleNotFoundError" in str(error)
            else ""
        )
        raise Stop(f"{error}{hint}") from None


# -- versions ---------------------------------------------------------------------------


async def _versions(args: argparse.Namespace) -> int:
    counts: dict[tuple[str, int], int] = {}
    async with _opened(args.target, CALL_TIMEOUT_S) as api:

        async def count() -> None:
            async for row in api.list():
                if row.type.startswith(BUILT_IN) or row.status in R.FINAL:
                    continue
                journal = (await api.run(row.id).describe()).journal
                version = journal[0].version if journal and isinstance(journal[0], R.Started) else 0
                counts[(row.type, version)] = counts.get((row.type, version), 0) + 1

        await _within(count(), "the listing")
    rows = sorted(counts.items())
    if args.json:
        print(json.dumps([{"type": t, "version": v, "live": n} for (t, v), n in rows], indent=1))
        return EXIT_OK
    if not rows:
        print("no live runs")
        return EXIT_OK
    print("\n".join(table(["type", "version", "live runs"], [[t, str(v), str(n)] for (t, v), n in rows])))
    return EXIT_OK
