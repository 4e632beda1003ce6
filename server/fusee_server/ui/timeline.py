"""A run's journal (as `GET /v1/runs/{id}` gives it: records as JSON dicts, oldest
first) turned into what the run page shows: its input and outcome, its steps with each
attempt and error, the signals and updates it received, its children and parent, who
asked for what (`by`), and one timeline row per record.

Plain data in, plain data out: the template escapes every string it prints, so nothing
here builds HTML.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any


class Encoded(str):
    """An encrypted payload, shown as `encrypted`; `b64` is its sealed bytes, which a page
    hands to the codec endpoint to show it decoded (`--codec-url`)."""

    b64: str

    def __new__(cls, b64: Any) -> Encoded:
        shown = super().__new__(cls, "encrypted")
        shown.b64 = b64 if isinstance(b64, str) else ""
        return shown


def show(value: Any) -> str:
    """A payload as JSON text, for a <pre> (the template escapes it); an encrypted one
    as `encrypted` (the server holds no key: see docs/web-ui.md for a codec endpoint)."""
    if isinstance(value, dict) and set(value) == {"$encoded"}:
        return Encoded(value["$encoded"])
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return repr(value)


def when(ms: Any) -> str:
    """Unix milliseconds as UTC time, or "" for none (0: not recorded)."""
    if not isinstance(ms, int) or ms <= 0:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def failure_text(failure: Any) -> str:
    """A recorded failure as one line: its type and message."""
    if not isinstance(failure, dict):
        return str(failure) if failure is not None else ""
    kind = failure.get("type") or failure.get("code") or ""
    message = failure.get("message") or ""
    return f"{kind}: {message}" if kind else str(message)


@dataclasses.dataclass
class Attempt:
    number: int
    error: str
    retry_at: str
    paused: bool


@dataclasses.dataclass
class Step:
    seq: int
    name: str
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    state: str = "running"  # done, failed, paused, running
    value: str = ""
    error: str = ""
    resumed_by: list[str] = dataclasses.field(default_factory=list)
    progress: str = ""  # its latest heartbeat's progress


@dataclasses.dataclass
class Row:
    """One record on the timeline: what it is, a one-line summary, and who asked."""

    kind: str
    summary: str
    by: str = ""
    error: bool = False
    at: str = ""  # when, for the records that say (a start, a failed attempt)
    stream: str = ""  # a StreamChunk's stream: chunks in a row are one line
    chunks: int = 1


@dataclasses.dataclass
class Timeline:
    input: str = ""
    started_at: str = ""
    parent: str = ""  # the parent's workflow ID
    outcome: str = ""  # ok, failed, ... (absent while it runs)
    result: str = ""
    failure: str = ""
    ended_by: str = ""
    steps: list[Step] = dataclasses.field(default_factory=list)
    signals: list[dict[str, str]] = dataclasses.field(default_factory=list)
    updates: list[dict[str, str]] = dataclasses.field(default_factory=list)
    children: list[dict[str, str]] = dataclasses.field(default_factory=list)
    # Each stream: its chunks as one text (strings joined, other values as JSON lines),
    # how many, and how it ended ("" while it grows).
    streams: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    audit: list[dict[str, str]] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)

    @property
    def step_names(self) -> list[str]:
        """The steps a reset may go back to, in the order they began, each once."""
        return list(dict.fromkeys(step.name for step in self.steps))


def timeline(journal: list[dict[str, Any]]) -> Timeline:
    out = Timeline()
    steps: dict[int, Step] = {}
    updates: dict[str, dict[str, str]] = {}
    children: dict[int, dict[str, str]] = {}

    def step(record: dict[str, Any]) -> Step:
        seq = int(record.get("seq", 0))
        found = steps.get(seq)
        if found is None:
            found = steps[seq] = Step(seq, str(record.get("name", "")))
            out.steps.append(found)
        return found

    for record in journal:
        kind = str(record.get("kind", "?"))
        by = str(record.get("by") or "")
        row = Row(kind, "", by, at=when(record.get("now") or record.get("failedAt")))
        if kind == "Started":
            out.input = show(record.get("input"))
            out.started_at = when(record.get("now"))
            parent = record.get("parent")
            if isinstance(parent, dict):
                out.parent = str(parent.get("wid", ""))
            row.summary = f"{record.get('type')} v{record.get('version')}"
        elif kind == "StepDone":
            done = step(record)
            done.state, done.value = "done", show(record.get("value"))
            row.summary = f"step {done.name} returned {_short(record.get('value'))}"
        elif kind == "Attempt":
            tried = step(record)
            error = failure_text(record.get("failure"))
            paused = bool(record.get("paused"))
            tried.attempts.append(
                Attempt(int(record.get("attempt", 0)), error, when(record.get("retryAt")), paused)
            )
            tried.state = "paused" if paused else "retrying"
            row.summary = f"step {tried.name} attempt {record.get('attempt')} failed: {error}"
            row.error = True
        elif kind == "StepFailed":
            failed = step(record)
            failed.state, failed.error = "failed", failure_text(record.get("failure"))
            # The last attempt's failure is this record's (no Attempt record of its own).
            failed.attempts.append(Attempt(len(failed.attempts) + 1, failed.error, "", False))
            row.summary, row.error = f"step {failed.name} failed: {failed.error}", True
        elif kind == "Resume":
            resumed = step(record)
            resumed.state = "retrying"
            resumed.resumed_by.append(by)
            row.summary = f"step {resumed.name} resumed"
            out.audit.append({"what": f"resume {resumed.name}", "by": by})
        elif kind == "SignalReceived":
            out.signals.append(
                {"name": str(record.get("name")), "value": show(record.get("value")), "by": by,
                 "id": str(record.get("id") or "")}
            )  # fmt: skip
            row.summary = f"signal {record.get('name')}: {_short(record.get('value'))}"
        elif kind == "UpdateAccepted":
            update = {"id": str(record.get("id")), "name": str(record.get("name")),
                      "arg": show(record.get("arg")), "result": "", "error": ""}  # fmt: skip
            updates[update["id"]] = update
            out.updates.append(update)
            row.summary = f"update {update['name']} accepted ({update['id']})"
        elif kind == "UpdateDone":
            update = updates.get(str(record.get("id")), {})
            if record.get("failure") is not None:
                update["error"] = failure_text(record.get("failure"))
                row.error = True
            else:
                update["result"] = show(record.get("value"))
            row.summary = f"update {update.get('name', record.get('id'))} done"
        elif kind == "ChildRequested":
            child = {"id": str(record.get("id")), "type": str(record.get("type")), "state": "requested"}
            children[int(record.get("seq", 0))] = child
            out.children.append(child)
            row.summary = f"child {child['id']} ({child['type']})"
        elif kind in ("ChildStarted", "ChildResult"):
            child = children.get(int(record.get("seq", 0)), {})
            child_failed = record.get("failure") is not None
            child["state"] = ("failed" if child_failed else "done") if kind == "ChildResult" else "started"
            if child_failed:
                child["error"] = failure_text(record.get("failure"))
            row.summary, row.error = f"child {child.get('id', '?')} {child.get('state')}", child_failed
        elif kind == "CancelRequested":
            row.summary = f"cancel requested: {record.get('reason') or ''}"
            out.audit.append({"what": "cancel", "by": by, "reason": str(record.get("reason") or "")})
        elif kind == "Reset":
            row.summary = f"reset to before step {record.get('step')} (run {record.get('run')})"
            out.audit.append({"what": f"reset before {record.get('step')}", "by": by})
        elif kind == "Finished":
            out.outcome = str(record.get("status"))
            out.ended_by = by
            if record.get("failure") is not None:
                out.failure = failure_text(record.get("failure"))
                row.error = True
            else:
                out.result = show(record.get("value"))
            row.summary = f"finished: {out.outcome}" + (f" ({out.failure})" if out.failure else "")
            if by:
                out.audit.append({"what": out.outcome, "by": by})
        elif kind == "TimerStarted":
            row.summary = f"timer {record.get('name')} due {when(record.get('due'))}"
        elif kind == "WaitStarted":
            due = when(record.get("due"))
            row.summary = f"waiting for signal {record.get('signal')}" + (f" until {due}" if due else "")
        elif kind == "Heartbeat":
            beat = step(record)
            beat.progress = show(record.get("progress"))
            row.summary = f"step {beat.name} progress {_short(record.get('progress'))}"
        elif kind == "StreamChunk":
            row.stream = str(record.get("stream"))
            shown = out.streams.setdefault(str(record.get("stream")), {"text": "", "count": 0, "end": ""})
            value = record.get("value")
            if isinstance(value, dict) and set(value) == {"$encoded"}:
                value = "(encrypted)"
            shown["text"] += value if isinstance(value, str) else _short(value) + "\n"
            shown["count"] += 1
            row.summary = f"stream {record.get('stream')}: {_short(record.get('value'))}"
        elif kind == "StreamEnd":
            shown = out.streams.setdefault(str(record.get("stream")), {"text": "", "count": 0, "end": ""})
            shown["end"] = str(record.get("status"))
            row.summary = f"stream {record.get('stream')} complete ({record.get('status')})"
        elif kind == "AttributesSet":
            row.summary = "set attributes " + _short(record.get("attrs"))
        elif kind == "Patched":
            row.summary = f"took patch {record.get('id')}"
        elif kind == "SignalSent":
            row.summary = f"sent signal {record.get('name')} to {record.get('target')}"
        else:
            row.summary = _short({k: v for k, v in record.items() if k != "kind"})
        last = out.rows[-1] if out.rows else None
        if (
            kind == "StreamChunk"
            and last is not None
            and last.kind == "StreamChunk"
            and last.stream == row.stream
        ):
            # A stream's chunks in a row are one line: a long answer is thousands of them.
            last.chunks += 1
            last.summary = f"stream {row.stream}: {last.chunks} chunks"
            continue
        out.rows.append(row)
    return out


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
