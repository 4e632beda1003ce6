"""`fusee objects`: show and repair an object key's state through a server (docs/objects.md,
*Editing state from outside*).

Every edit is the built-in exclusive handler `fusee.state.edit`, so it waits for the key
like any call and commits with its result; it names its requester `cli:USER`. `edit`
opens the state in $EDITOR and applies what changed with the version it showed (a key
changed meanwhile refuses the edit, and nothing is lost). The command takes a server's
address only: on a data directory, reading or editing a key replays its handlers, which
only the application's code can do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any

import fusee
from fusee._cli_common import ADDRESS_HELP, EXIT_OK, Stop, with_client
from fusee._cli_runs import requester
from fusee.engine.objects.edit import apply_edit, check_edit

ACTIONS = ("ls", "show", "set", "patch", "clear", "edit")


def register(commands: Any) -> None:
    objects = commands.add_parser(
        "objects",
        allow_abbrev=False,
        help="show and edit an object key's state through a server (docs/objects.md)",
        description="List an object type's keys, show a key's state and version, or edit it: set a "
        "field, apply a JSON Patch, clear a field or all of it, or edit it in $EDITOR. Each edit "
        "waits for the key like an exclusive call and records who asked as cli:USER.",
    )
    actions = objects.add_subparsers(dest="action", metavar="<action>", required=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("address", help=ADDRESS_HELP)
    common.add_argument("type", help="the object type")

    def action(name: str, help: str, key: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(
            name, parents=[common], allow_abbrev=False, help=help, description=help
        )
        if key:
            parser.add_argument("key", help="the object's key")
        if name not in ("ls", "show"):
            parser.add_argument(
                "--if-version", help="refuse the edit if the state is no longer at this version"
            )
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
        return parser

    action("ls", "the type's keys", key=False)
    action("show", "the key's state, its version and the calls running and waiting")
    set_ = action("set", "set one field (VALUE is JSON: '\"gift wrap\"', 3, null clears it)")
    set_.add_argument("field")
    set_.add_argument("value", type=_json_arg)
    patch = action("patch", "apply a JSON Patch (RFC 6902) to the state")
    patch.add_argument("ops", type=_json_arg, help='e.g. \'[{"op": "remove", "path": "/items/0"}]\'')
    patch.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")
    clear = action("clear", "clear one field, or (no field) all of the state")
    clear.add_argument("field", nargs="?")
    action("edit", "edit the state as JSON in $EDITOR; what changed is applied")
    objects.set_defaults(run=run)


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({error}); quote a string: '\"text\"'"
        ) from None


def run(args: argparse.Namespace) -> int:
    if os.path.isdir(args.address):
        raise Stop(
            f"{args.address} is a directory: fusee objects takes a server's address (host:port). "
            "Reading or editing a key replays its handlers, which only the application's code can do: "
            "read and edit it there, with engine.object(type, key)"
        )
    with fusee.as_requester(requester()):
        answer = with_client(args.address, lambda client: _act(client, args))
    if answer is not None:
        print(json.dumps(answer, indent=2, sort_keys=True) if args.json else _shown(args, answer))
    return EXIT_OK


async def _act(client: Any, args: argparse.Namespace) -> Any:
    if args.action == "ls":
        return {"type": args.type, "keys": sorted([key async for key in client.objects(args.type)])}
    ref = client.object_ref(args.type, args.key)
    if args.action == "show":
        return await ref.inspect()
    by = requester()
    if args.action == "edit":
        return await _in_editor(ref, args, by)
    edit: dict[str, Any]
    if args.action == "set":
        edit = {"set": {args.field: args.value}}
    elif args.action == "patch":
        edit = {"patch": args.ops}
    else:
        edit = {"clear": [args.field]} if args.field else {"clear_all": True}
    check_edit(edit)
    if getattr(args, "dry_run", False):
        return await _dry_run(ref, edit)
    return await ref.edit_state(edit, if_version=args.if_version, by=by)


async def _dry_run(ref: Any, edit: dict[str, Any]) -> dict[str, Any]:
    from fusee import _codec as codec

    detail = await ref.inspect()
    fields = {k: codec.encode(v, f"state field '{k}'") for k, v in detail["state"].items()}
    after, changed = apply_edit(fields, edit)
    state = {k: codec.decode(v, Any, f"state field '{k}'") for k, v in after.items()}
    return {"dry_run": True, "version": detail["version"], "changed": changed, "state": state}


async def _in_editor(ref: Any, args: argparse.Namespace, by: str) -> dict[str, Any] | None:
    detail = await ref.inspect()
    before: dict[str, Any] = detail["state"]
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as file:
        json.dump(before, file, indent=2, sort_keys=True)
        file.write("\n")
        path = file.name
    try:
        if subprocess.call([*shlex.split(editor), path]) != 0:
            raise Stop(f"{editor} exited with an error: nothing was changed")
        with open(path) as file:
            text = file.read()
    finally:
        os.unlink(path)
    try:
        after = json.loads(text)
    except ValueError as error:
        raise Stop(f"the edited state is not JSON ({error}): nothing was changed") from None
    if not isinstance(after, dict):
        raise Stop("the edited state must stay a JSON object of fields: nothing was changed")
    sets = {k: v for k, v in after.items() if before.get(k) != v}
    clears = [k for k in before if k not in after]
    if not sets and not clears:
        print("no change", file=sys.stderr)
        return None
    version = args.if_version or detail["version"]
    answer: dict[str, Any] = await ref.edit_state({"set": sets, "clear": clears}, if_version=version, by=by)
    return answer


def _shown(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    if args.action == "ls":
        return "\n".join(answer["keys"]) or f"(no keys of {args.type})"
    if args.action == "show":
        lines = [
            f"{args.type}/{args.key}  version {answer['version']}"
            + ("" if answer["exists"] else "  (no run)")
        ]
        lines.append(json.dumps(answer["state"], indent=2, sort_keys=True))
        for what in ("running", "waiting"):
            for c in answer.get(what, []):
                lines.append(f"{what}: {c['handler']}" + (f" (id {c['id']})" if c.get("id") else ""))
        return "\n".join(lines)
    head = "would change" if answer.get("dry_run") else "changed"
    lines = [f"{head}: {', '.join(answer['changed']) or 'nothing'}; version {answer['version']}"]
    if answer.get("dry_run"):
        lines.append(json.dumps(answer["state"], indent=2, sort_keys=True))
    return "\n".join(lines)
