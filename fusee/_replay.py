"""Strict replay: run code against a recorded journal with nothing executing, and name
the first difference. Used by `TestEngine.check()`, the golden journals and `Replayer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from fusee import _codec as codec
from fusee import _records as R
from fusee._definitions import DEFAULT_RETRY, Workflow
from fusee._errors import DeterminismError, FuseeError
from fusee._run import RunState

_PAYLOADS = ("input", "value", "arg", "update_arg")


class _Sandbox:
    """Stands where a shard stands during replay; live calls mean the code went past
    its journal, which replay never does."""

    def __init__(self, workflows: dict[str, Workflow[Any]]) -> None:
        self.engine = self
        self.workflows = workflows
        self.default_retry = DEFAULT_RETRY
        self.record_stacks = True
        self.profile = "dev"
        self.step_mocks: dict[Any, Any] = {}
        self.stuck_message: str | None = None

    def run_stuck(self, run: RunState) -> None:
        self.stuck_message = str(run.stuck_error)

    def now_ms(self) -> int:
        return 0

    def new_seed(self) -> int:
        return 0


class Replayer:
    """Replays journals against the registered code."""

    def __init__(self, workflows: Sequence[Workflow[Any]]) -> None:
        self.workflows = {wf.name: wf for wf in workflows}

    def replay(self, records: Sequence[R.Rec], wid: str = "replay", run_no: int = 1) -> None:
        """Raise DeterminismError naming the first difference between code and journal."""
        started = records[0]
        if not isinstance(started, R.Started):
            raise DeterminismError(
                f"run '{wid}': a journal starts with Started, not {type(started).__name__}"
            )
        if started.type not in self.workflows:
            raise DeterminismError(f"run '{wid}': no code registered for workflow type '{started.type}'")
        sandbox = _Sandbox(self.workflows)
        run = RunState(sandbox, wid, run_no, started)  # type: ignore[arg-type]
        run.replay(list(records))
        if run.status == "stuck":
            raise DeterminismError(sandbox.stuck_message or f"run '{wid}' does not match its journal")
        last = records[-1]
        if isinstance(last, R.Finished) and last.status == "ok" and run.code_outcome is not None:
            value, exc = run.code_outcome
            if exc is None and codec.encode(value) != last.value:
                raise DeterminismError(
                    f"run '{wid}': the journal recorded the result {last.value!r} but the code "
                    f"returned {codec.encode(value)!r}"
                )

    def replay_file(self, path: str) -> None:
        with open(path, "rb") as f:
            document = msgspec.json.decode(f.read())
        self.replay(journal_from_json(document["journal"]), document.get("id", path))


def journal_to_json(records: Sequence[R.Rec]) -> list[dict[str, Any]]:
    """Records as plain JSON values, payloads decoded: stable for snapshots and goldens."""
    out = []
    for rec in records:
        row: dict[str, Any] = {"kind": type(rec).__name__}
        for name in rec.__struct_fields__:
            value = getattr(rec, name)
            if name in _PAYLOADS and isinstance(value, bytes):
                value = codec.decode(value)
                if isinstance(value, bytes):
                    value = {"$bytes": value.hex()}
            elif isinstance(value, msgspec.Struct):
                value = msgspec.to_builtins(value)
            row[name] = value
        out.append(row)
    return out


_KINDS = {cls.__name__: cls for cls in R.Record.__args__}


def journal_from_json(rows: Sequence[dict[str, Any]]) -> list[R.Rec]:
    records = []
    for row in rows:
        cls = _KINDS.get(row.get("kind", ""))
        if cls is None:
            raise FuseeError(f"unknown record kind {row.get('kind')!r}")
        fields = {k: v for k, v in row.items() if k != "kind"}
        for name in _PAYLOADS:
            if name in fields and fields[name] is not None:
                value = fields[name]
                fields[name] = (
                    codec.encode(bytes.fromhex(value["$bytes"]))
                    if isinstance(value, dict) and set(value) == {"$bytes"}
                    else codec.encode(value)
                )
        records.append(msgspec.convert(fields, cls))
    return records
