"""An exported journal is an external input (`Replayer.replay_file`, `fusee.Replayer`):
random and mutated documents get a FuseeError, never anything else (no KeyError,
TypeError, RecursionError from inside the replay)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusee
from fusee.engine.replay import Replayer, journal_from_json
from tests.support.golden import GOLDEN, g_approval, g_child, g_parent, g_pay, g_retry

REPLAYER = Replayer([g_retry, g_approval, g_parent, g_child, g_pay])
DOCUMENTS = [json.loads(path.read_text()) for path in sorted(GOLDEN.glob("*.json"))]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def replay(rows: Any, wid: str = "fuzzed") -> None:
    try:
        REPLAYER.replay(journal_from_json(rows), wid)
    except fusee.FuseeError:
        pass  # the documented outcome of a journal that is not one, or does not match


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A golden journal with one row changed: a field set to a random value, a field or a
    row dropped, a row duplicated, or the kind renamed."""
    document = draw(st.sampled_from(DOCUMENTS))
    rows = json.loads(json.dumps(document["journal"]))
    at = draw(st.integers(0, len(rows) - 1))
    how = draw(st.sampled_from(["set", "drop-field", "drop-row", "repeat-row", "kind"]))
    row = rows[at]
    if how == "set":
        row[draw(st.sampled_from(sorted(row)))] = draw(json_values)
    elif how == "drop-field" and len(row) > 1:
        del row[draw(st.sampled_from(sorted(k for k in row if k != "kind")))]
    elif how == "drop-row":
        del rows[at]
    elif how == "repeat-row":
        rows.insert(at, json.loads(json.dumps(row)))
    else:
        row["kind"] = draw(st.sampled_from(["StepDone", "Finished", "Started", "Nope", "TimerFired"]))
    return rows, document["id"]


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_journal_gets_a_fusee_error_or_replays(case: tuple[Any, str]) -> None:
    replay(*case)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(json_values, max_size=5) | json_values)
def test_a_random_document_gets_a_fusee_error(rows: Any) -> None:
    replay(rows)


def test_a_file_that_is_not_json_gets_a_fusee_error(tmp_path: Path) -> None:
    path = tmp_path / "j.json"
    for content in (b"", b"{", b"\xff\xfe", b'{"journal": 3}', b"[]", b'{"journal": [{"kind": "Started"}]}'):
        path.write_bytes(content)
        try:
            REPLAYER.replay_file(str(path))
        except fusee.FuseeError:
            continue
