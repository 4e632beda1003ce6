"""Strict replay: run code against a recorded journal with nothing executing, and name
the first difference. Used by `TestEngine.check()`, the golden journals and `Replayer`."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from fusee import _codec as codec
from fusee import journal as R
from fusee._errors import DeterminismError, Failure, FuseeError
from fusee._sealing import ENCODED, SEALED, AesGcm, open_rec
from fusee.engine.objects import Objects
from fusee.engine.run import RunState
from fusee.journal import Status
from fusee.workflow.definitions import DEFAULT_RETRY, Workflow
from fusee.workflow.objects import ObjectType


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

    def __init__(self, workflows: Sequence[Workflow[Any] | ObjectType], codec: AesGcm | None = None) -> None:
        code = [Objects.workflow_of(w) if isinstance(w, ObjectType) else w for w in workflows]
        self.workflows = {wf.name: wf for wf in code}
        self.codec = codec  # opens journals exported encrypted (through a server, say)

    def replay(self, records: Sequence[R.Rec], wid: str = "replay", run_no: int = 1) -> None:
        """Raise DeterminismError naming the first difference between code and journal."""
        if not records:
            raise DeterminismError(f"run '{wid}': the journal is empty; a journal starts with Started")
        started = records[0]
        if not isinstance(started, R.Started):
            raise DeterminismError(
                f"run '{wid}': a journal starts with Started, not {type(started).__name__}"
            )
        if started.type not in self.workflows:
            raise DeterminismError(f"run '{wid}': no code registered for workflow type '{started.type}'")
        if self.codec is not None:
            records = [open_rec(self.codec, rec) for rec in records]
        sandbox = _Sandbox(self.workflows)
        run = RunState(sandbox, wid, run_no, started)  # type: ignore[arg-type]
        run.replay(list(records))
        if run.status == Status.STUCK:
            raise DeterminismError(sandbox.stuck_message or f"run '{wid}' does not match its journal")
        last = records[-1]
        if isinstance(last, R.Finished) and last.status == Status.OK and run.code_outcome is not None:
            value, exc = run.code_outcome
            if exc is None and codec.encode(value) != last.value:
                raise DeterminismError(
                    f"run '{wid}': the journal recorded the result {last.value!r} but the code "
                    f"returned {codec.encode(value)!r}"
                )

    def replay_file(self, path: str | Path) -> None:
        """Replay one exported journal (`fusee export`, `engine.export_journal`): raises
        DeterminismError naming the first difference, FuseeError for a file that is not
        an export."""
        document = read_export(path)
        self.replay(records_of(document, path), document["id"], document["run"])

    def replay_dir(self, path: str | Path) -> list[ReplayOutcome]:
        """Replay every `*.fjnl` under `path`, in name order: one outcome each, the
        first difference named for each run the code would leave stuck."""
        files = sorted(Path(path).rglob(f"*{EXPORT_SUFFIX}"))
        if not files:
            raise FuseeError(f"{path}: no exported journals (*{EXPORT_SUFFIX}) there")
        return [self.check_file(file) for file in files]

    def check_file(self, path: str | Path) -> ReplayOutcome:
        """One export replayed, whatever happens: its outcome (`readable` False for a
        file that is not an export, or whose rows are not records)."""
        try:
            document = read_export(path)
            records = records_of(document, path)
        except FuseeError as error:
            return ReplayOutcome(str(path), Path(path).stem, False, error.message, readable=False)
        wid, status = document["id"], str(document.get("status") or "")
        try:
            self.replay(records, wid, document["run"])
        except FuseeError as error:
            # The difference alone: the engine's advice to a waiting run does not fit here.
            return ReplayOutcome(str(path), wid, False, error.message.split(". The run waits")[0], status)
        return ReplayOutcome(str(path), wid, True, None, status)


class ReplayOutcome(msgspec.Struct):
    """One journal `Replayer.replay_dir` replayed: `error` names the first difference
    (or, `readable` False, why the file is not an export); `status` is the run's then."""

    path: str
    workflow_id: str
    ok: bool
    error: str | None = None
    status: str = ""
    readable: bool = True

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATUSES


# -- exported journals (.fjnl) --------------------------------------------------------

ENDED_STATUSES = frozenset(str(status) for status in R.ENDED)
EXPORT_FORMAT = "fusee-journal"
EXPORT_VERSION = 1
EXPORT_SUFFIX = ".fjnl"


def export_document(summary: Any, journal: Sequence[R.Rec]) -> dict[str, Any]:
    """A run's journal as an export: JSON, payloads decoded as `journal_to_json` shows
    them (docs/engine.md, *Exporting journals*)."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "id": summary.id,
        "run": summary.run,
        "type": summary.type,
        "status": str(summary.status),
        "journal": journal_to_json(journal),
    }


def records_of(document: dict[str, Any], path: str | Path) -> list[R.Rec]:
    """An export's records, refused (FuseeError) naming the file and the row."""
    try:
        return journal_from_json(document["journal"])
    except FuseeError as error:
        raise FuseeError(f"{path}: {error.message}") from None


def whole(journal: Sequence[R.Rec]) -> bool:
    """The journal is a run's from its start (a finished run without kept history keeps
    only its outcome)."""
    return bool(journal) and isinstance(journal[0], R.Started)


def read_export(path: str | Path) -> dict[str, Any]:
    """An export file's document, refused (FuseeError naming the file) unless it is one."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise FuseeError(f"{path}: cannot read it: {error.strerror or error}") from None
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise FuseeError(f"{path} is not JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("journal"), list):
        raise FuseeError(f'{path}: not an exported journal: expected {{"id": ..., "journal": [records]}}')
    if document.get("format", EXPORT_FORMAT) != EXPORT_FORMAT or document.get("version", 1) != EXPORT_VERSION:
        raise FuseeError(
            f"{path}: format {document.get('format')!r} version {document.get('version')!r}; "
            f"this fusee reads {EXPORT_FORMAT!r} version {EXPORT_VERSION}"
        )
    wid = document.get("id")
    document["id"] = wid if isinstance(wid, str) and wid else Path(path).stem
    run = document.get("run")
    document["run"] = run if isinstance(run, int) and not isinstance(run, bool) and run > 0 else 1
    return document


def journal_to_json(records: Sequence[R.Rec]) -> list[dict[str, Any]]:
    """Records as plain JSON values, payloads decoded: stable for snapshots and goldens.
    An absent payload is left out of its row; a JSON `null` payload is `null`."""
    out = []
    for rec in records:
        row: dict[str, Any] = {"kind": type(rec).__name__}
        payloads = R.payload_fields(type(rec))
        for name in rec.__struct_fields__:
            value = getattr(rec, name)
            if name in payloads:
                if value is None:
                    continue
                if value[:1] == SEALED:  # encrypted, kept so: replay needs the codec's keys
                    row[name] = {ENCODED: base64.b64encode(value).decode()}
                    continue
                value = codec.decode(value)
                if isinstance(value, bytes):
                    value = {"$bytes": value.hex()}
            elif (name in _SHOWN_WHEN_SET or (type(rec), name) in _SHOWN_WHEN_SET) and not value:
                continue
            else:
                value = msgspec.to_builtins(value)
            row[name] = value
        out.append(row)
    return out


# Fields added after journals were exported, left out at their default so that an export
# (and the goldens) of a journal that does not use them reads as it always did.
_SHOWN_WHEN_SET: frozenset[Any] = frozenset(
    {"not_before", "paused", (R.Finished, "by"), "traceparent", "trace"}
)


_KINDS: dict[str, type[R.Rec]] = {cls.__name__: cls for cls in R.Record.__args__}
_NESTED: dict[str, Any] = {
    "failure": Failure | None,
    "parent": R.Parent | None,
    "closes": list[tuple[str, int, str]],
}


def journal_from_json(rows: Sequence[dict[str, Any]]) -> list[R.Rec]:
    """The inverse of `journal_to_json`. An exported journal is outside input: a row that
    is not a record of its kind, with fields of their types, is refused naming the row."""
    if not isinstance(rows, list):
        raise FuseeError(f"a journal is a list of records, not {type(rows).__name__}")
    records = []
    for index, row in enumerate(rows):
        try:
            records.append(_record_of(row))
        except FuseeError as error:
            raise FuseeError(f"journal row {index}: {error.message}") from None
        except (
            TypeError,
            ValueError,
            KeyError,
            AttributeError,
            OverflowError,
            msgspec.ValidationError,
        ) as error:
            raise FuseeError(f"journal row {index} is not a record: {error}") from None
    return records


def _record_of(row: Any) -> R.Rec:
    if not isinstance(row, dict):
        raise FuseeError(f"a record is an object, not {type(row).__name__}")
    kind = row.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FuseeError(f"unknown record kind {kind!r}")
    payloads = R.payload_fields(cls)
    fields: dict[str, Any] = {}
    for name, value in row.items():
        if name == "kind":
            continue
        if name in payloads:
            is_raw = isinstance(value, dict) and set(value) == {"$bytes"}
            if isinstance(value, dict) and set(value) == {ENCODED} and isinstance(value[ENCODED], str):
                value = _sealed_bytes(value[ENCODED])
            else:
                value = codec.encode(bytes.fromhex(value["$bytes"]) if is_raw else value)
        elif name in _NESTED:
            value = _from_builtins(value, _NESTED[name])
        fields[name] = value
    rec = cls(**fields)
    # Through the log's own codec: every field is then of its declared type, exactly as a
    # record read back from disk is.
    decoded: R.Rec = R.decode_entry(R.encode_entry(R.Entry("", 0, rec))).rec
    return decoded


def _sealed_bytes(text: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise FuseeError("an $encoded payload is not base64") from None
    if data[:1] != SEALED:
        raise FuseeError("an $encoded payload does not hold a sealed payload")
    return data


def _from_builtins(value: Any, type_: Any) -> Any:
    """Nested structs: msgspec's array-like structs are arrays in builtins form."""
    if isinstance(value, dict) and "message" in value:
        return msgspec.convert(value, Failure)
    return msgspec.convert(value, type_)
