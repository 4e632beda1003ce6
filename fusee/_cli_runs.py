"""`fusee runs`: list, show and repair runs, through a server or on a data directory
(docs/run-operations.md, *The fusee runs command*).

Every action takes a TARGET: a data directory (one holding fusee.meta) is opened here
as an engine without any workflow code, so what it records (a signal, a cancel, a
resume...) is durable when the command returns, and the application's engine acts on
it when it next opens the directory; anything else is a server's address, as
`fusee schedules` takes it. The engine and the client have the same run handles and
listing, so each action is written once against either. The calls name their requester
`cli:USER` (`by` in the records they write).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import getpass
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec

import fusee
from fusee._cli_common import ADDRESS_HELP, EXIT_OK, EXIT_PARTIAL, Stop, seconds, table
from fusee._sealing import ENCODED, SEALED

T = TypeVar("T")

LIST_LIMIT = 100
BULK_CONCURRENCY = 128  # 1,000 resumes through a server: 2.6 s (32: 6.1 s)
CALL_TIMEOUT_S = 30.0
PROGRESS_EVERY_S = 1.0
SHOWN_CHARS = 80  # a value in `show`'s table is cut after this many characters

TARGET_HELP = f"a data directory (holds fusee.meta), or {ADDRESS_HELP}"
LIST_COLUMNS = ("id", "run", "type", "status", "shard")


def register(commands: Any) -> None:
    """`fusee runs ACTION TARGET ...` under the `fusee` command's subcommands."""
    runs = commands.add_parser(
        "runs",
        allow_abbrev=False,
        help="list, show and repair runs, through a server or on a data directory",
        description="List runs, show one with its journal, and signal, cancel, terminate, reset, "
        "retry or resume them, through a fusee server (its address) or on a data directory no "
        "process has open. The calls record who asked as cli:USER (docs/run-operations.md).",
    )
    actions = runs.add_subparsers(dest="action", metavar="<action>", required=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("target", help=TARGET_HELP)
    common.add_argument("--json", action="store_true", help="print the answer as JSON")
    common.add_argument(
        "--timeout",
        type=seconds,
        default=CALL_TIMEOUT_S,
        help=f"seconds to wait for each answer (default {CALL_TIMEOUT_S:g})",
    )

    def action(name: str, help: str, *, with_id: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(
            name, parents=[common], allow_abbrev=False, help=help, description=help
        )
        if with_id:
            parser.add_argument("id", help="the run's workflow ID")
        return parser

    ls = action("ls", "list runs, sorted by ID, a page at a time", with_id=False)
    _filters(ls)
    ls.add_argument("--after", metavar="ID", help="the page after this ID (the last one shown)")
    ls.add_argument("--limit", type=_count, default=LIST_LIMIT, help=f"rows a page (default {LIST_LIMIT})")
    action("show", "a run's summary and its journal")
    signal = action("signal", "send a run a signal")
    signal.add_argument("name", help="the signal's name")
    signal.add_argument("value", nargs="?", default="null", help="its value, as JSON (default null)")
    signal.add_argument("--signal-id", help="the signal's ID: sending it again records it once")
    for name in ("cancel", "terminate"):
        action(name, f"{name} a run").add_argument("--reason", help="why (recorded)")
    reset = action("reset", "start the ID's next run from just before a step")
    reset.add_argument("--before-step", "--before", dest="before_step", required=True, help="the step")
    reset.add_argument(
        "--no-reapply-signals",
        dest="reapply_signals",
        action="store_false",
        help="do not give the new run the signals received after the cut",
    )
    action("retry", "a failed run again from its failed step")
    action("resume", "run a step paused out of retries again")
    bulk = actions.add_parser(
        "bulk", allow_abbrev=False, help="resume every paused run a filter selects, with progress"
    )
    bulk_actions = bulk.add_subparsers(dest="bulk_action", metavar="<action>", required=True)
    resume = bulk_actions.add_parser(
        "resume",
        parents=[common],
        allow_abbrev=False,
        help="resume the paused runs of a type (or all), several at a time",
        description="Resume every paused run the filters select, CONCURRENCY at a time, with "
        "progress on stderr. Exits 1 if any run was refused (each is named).",
    )
    _filters(resume, statuses=("paused",))
    resume.add_argument(
        "--concurrency",
        type=_count,
        default=BULK_CONCURRENCY,
        help=f"resumes in flight at once (default {BULK_CONCURRENCY})",
    )
    runs.set_defaults(run=run)


def _filters(parser: argparse.ArgumentParser, statuses: tuple[str, ...] | None = None) -> None:
    parser.add_argument("--type", help="only runs of this workflow type")
    if statuses is None:
        parser.add_argument("--status", help="only runs with this status (running, paused, failed, ok...)")
    else:
        parser.add_argument("--status", choices=statuses, default=statuses[0], help="(default: %(default)s)")
    parser.add_argument("--prefix", default="", help="only runs whose workflow ID starts with this")


def run(args: argparse.Namespace) -> int:
    with fusee.as_requester(requester()):
        try:
            code: int = asyncio.run(_act(args))
        except fusee.FuseeError as error:
            raise Stop(str(error)) from None
    return code


def requester() -> str:
    """`cli:USER`, as the audit records name the command line's user."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        return "cli"


async def _act(args: argparse.Namespace) -> int:
    async with _opened(args.target, args.timeout) as api:
        if args.action == "ls":
            return await _ls(api, args)
        if args.action == "show":
            return await _show(api, args)
        if args.action == "bulk":
            return await _bulk_resume(api, args)
        return await _operate(api, args)


@asynccontextmanager
async def _opened(target: str, timeout: float) -> AsyncIterator[Any]:
    """An engine on the data directory `target`, or a client of the server it names."""
    path = Path(target)
    if path.is_dir():
        engine = await _open_directory(path)
        try:
            yield engine
        finally:
            await engine.close()
        return
    where = target.partition("?")[0]  # the options may name files
    if ("/" in where or ":" not in where) and not where.startswith("unix:"):
        raise Stop(f"{target} is neither a data directory (none there) nor a server address (host:port)")
    from fusee.client import Client

    client = await _within(Client.connect(target), timeout, target)
    try:
        yield client
    finally:
        await client.close()


async def _open_directory(path: Path) -> fusee.Engine:
    if not (path / "fusee.meta").exists():
        raise Stop(f"{path} is not a Fusee data directory (no fusee.meta)")
    try:
        import fusee_server  # noqa: F401  (the disk path an open needs)
    except ImportError:
        raise Stop(
            "a data directory needs the fusee-server distribution: pip install fusee-server "
            "(or give the address of a server instead)"
        ) from None
    try:
        return await fusee.Engine.open(str(path))
    except fusee.FuseeError as error:
        # Held by a server or an application: one process writes a directory at a time.
        said = str(error)
        where = "" if said.startswith(f"{path}:") else f"{path}: "  # the error may name it already
        raise Stop(f"{where}{said} (or give the address of the server that holds it)") from None


async def _within(call: Awaitable[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(call, timeout)
    except TimeoutError:
        raise Stop(
            f"no answer about {what} within {timeout:g} s (through a server, a call waits for "
            "a worker to hold the run's shard: is one connected?)"
        ) from None


# -- ls and show ------------------------------------------------------------------------


async def _listed(api: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs the filters select, sorted by ID (a listing comes in shard order)."""

    async def rows() -> list[dict[str, Any]]:
        return [
            _summary(row)
            async for row in api.list(type=args.type, status=args.status)
            if row.id.startswith(args.prefix)
        ]

    return sorted(await _within(rows(), args.timeout, "the listing"), key=lambda row: row["id"])


async def _ls(api: Any, args: argparse.Namespace) -> int:
    rows = await _listed(api, args)
    if args.after is not None:
        rows = [row for row in rows if row["id"] > args.after]
    page, more = rows[: args.limit], len(rows) > args.limit
    after = page[-1]["id"] if more else None
    if args.json:
        print(json.dumps({"runs": page, "next_after": after}, indent=2))
        return EXIT_OK
    if not page:
        print("no runs")
        return EXIT_OK
    print("\n".join(table(list(LIST_COLUMNS), [[str(row[key]) for key in LIST_COLUMNS] for row in page])))
    if after is not None:
        print(f"more: --after {after}", file=sys.stderr)
    return EXIT_OK


async def _show(api: Any, args: argparse.Namespace) -> int:
    described = await _within(api.run(args.id).describe(), args.timeout, f"run '{args.id}'")
    summary = _summary(described.summary)
    journal = [_record(rec) for rec in described.journal]
    if args.json:
        print(json.dumps({"summary": summary, "journal": journal}, indent=2))
        return EXIT_OK
    print(
        f"{summary['id']}  run {summary['run']}  type {summary['type']}  {summary['status']}  "
        f"shard {summary['shard']}"
    )
    print(f"journal: {len(journal)} records")
    for i, rec in enumerate(journal):
        fields = " ".join(f"{key}={_shown(value)}" for key, value in rec.items() if key != "record")
        print(f"{i:>5}  {rec['record']:<15} {fields}".rstrip())
    return EXIT_OK


def _summary(row: Any) -> dict[str, Any]:
    return {"id": row.id, "run": row.run, "type": row.type, "status": str(row.status), "shard": row.shard}


def _record(rec: msgspec.Struct) -> dict[str, Any]:
    """A journal record as JSON: its kind, then its fields but those absent (None) or
    off (False), a payload as its value."""
    fields = {
        name: _plain(value)
        for name in rec.__struct_fields__
        if (value := getattr(rec, name)) is not None and value is not False
    }
    return {"record": type(rec).__name__, **fields}


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        if value.startswith(b"\x00"):  # the codec's mark of a raw bytes value
            return {"$bytes": base64.b64encode(value[1:]).decode()}
        if value[:1] == SEALED:  # encrypted, and this command has no key
            return {ENCODED: base64.b64encode(value).decode()}
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, msgspec.Struct):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return msgspec.to_builtins(value)


def _shown(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


# -- one run's operations ---------------------------------------------------------------


async def _operate(api: Any, args: argparse.Namespace) -> int:
    handle, action = api.run(args.id), args.action
    answer: dict[str, Any] = {"id": args.id, "action": action, "by": requester()}
    if action == "signal":
        try:
            value = json.loads(args.value)
        except json.JSONDecodeError as error:
            raise Stop(
                f"signal value {args.value!r} is not JSON ({error}); a string goes as '\"text\"'"
            ) from None
        call: Awaitable[Any] = handle.signal(args.name, value, id=args.signal_id)
    elif action in ("cancel", "terminate"):
        call = getattr(handle, action)(args.reason)
    elif action == "reset":
        call = handle.reset(args.before_step, reapply_signals=args.reapply_signals)
    else:
        call = getattr(handle, action)()
    new_run = await _within(call, args.timeout, f"run '{args.id}'")
    if action in ("reset", "retry"):
        answer["run"] = new_run
    if args.json:
        print(json.dumps(answer))
    else:
        done = f"now run {new_run}" if action in ("reset", "retry") else "recorded"
        print(f"{args.id}: {action} {done} (by {answer['by']})")
    return EXIT_OK


async def _bulk_resume(api: Any, args: argparse.Namespace) -> int:
    """Resume what the filters select, `concurrency` calls in flight at once: each is a
    round trip to the run's worker (or its shard here), so one at a time would leave the
    time spent waiting for answers idle."""
    ids = [row["id"] for row in await _listed(api, args)]
    refused: list[dict[str, str]] = []
    progress = _Progress(len(ids))
    pending = iter(ids)

    async def resumer() -> None:
        for wid in pending:
            try:
                await _within(api.run(wid).resume(), args.timeout, f"run '{wid}'")
            except (fusee.FuseeError, Stop) as error:
                refused.append({"id": wid, "error": str(error)})
                print(f"{wid}: {error}", file=sys.stderr)
            progress.step(len(refused))

    await asyncio.gather(*(resumer() for _ in range(min(args.concurrency, len(ids)))))
    resumed = len(ids) - len(refused)
    if args.json:
        print(json.dumps({"selected": len(ids), "resumed": resumed, "refused": refused}, indent=2))
    else:
        what = f"paused runs of type {args.type}" if args.type else "paused runs"
        print(f"resumed {resumed} of {len(ids)} {what}" + (f"; {len(refused)} refused" if refused else ""))
    return EXIT_PARTIAL if refused else EXIT_OK


class _Progress:
    """`resumed N/TOTAL` on stderr about once a second, and at the end."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.shown_at = time.monotonic()

    def step(self, refused: int) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done == self.total or now - self.shown_at >= PROGRESS_EVERY_S:
            self.shown_at = now
            print(f"resumed {self.done - refused}/{self.total} ({refused} refused)", file=sys.stderr)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{text}: give a number from 1 to 100000")
    return value
