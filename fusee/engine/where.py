"""`list(where=...)`: the filter a listing applies (docs/engine.md, *Search attributes*).

`where` maps a name to a value (equality) or to operators: `{"status": "paid", "amount":
{"gte": 100}, "type": "checkout"}`. `type`, `status`, `id` and `startedMs` are the run's
own fields; any other name is a search attribute. A condition on an attribute a run does
not have never matches (`ne` included). Order comparisons hold between numbers, or
between strings; a number against a string never matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fusee._errors import RejectedError
from fusee.engine.index import posting_key
from fusee.journal import STATUS_OF

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte")
FIELDS = ("type", "status", "id", "startedMs")
_NUMBER = (int, float)


class Where:
    """A compiled filter: the conditions on the run's fields, and on its attributes."""

    __slots__ = ("attrs", "fields")

    def __init__(self, where: Mapping[str, Any]) -> None:
        if not isinstance(where, Mapping):
            raise RejectedError(f"where={where!r}: expected a map of name to value or to operators")
        self.fields: list[tuple[str, str, Any]] = []
        self.attrs: list[tuple[str, str, Any]] = []
        for name, condition in where.items():
            if not isinstance(name, str) or not name:
                raise RejectedError(f"where: {name!r} is not a name")
            if isinstance(condition, Mapping):
                if not condition:
                    raise RejectedError(
                        f"where[{name!r}]: no operator (expected one of {', '.join(OPERATORS)})"
                    )
                pairs = list(condition.items())
            else:
                pairs = [("eq", condition)]
            for op, value in pairs:
                if op not in OPERATORS:
                    raise RejectedError(
                        f"where[{name!r}]: unknown operator {op!r} (expected one of {', '.join(OPERATORS)})"
                    )
                if op in ("gt", "gte", "lt", "lte") and not _ordered(value):
                    raise RejectedError(f"where[{name!r}][{op!r}]: {value!r} is not a number or a string")
                (self.fields if _field(name, value) else self.attrs).append((name, op, value))

    def equality(self) -> tuple[str, Any] | None:
        """An attribute equality the index can look up: the candidates are its keys."""
        for name, op, value in self.attrs:
            if op == "eq":
                posting = posting_key(name, value)
                if posting is not None:
                    return posting
        return None

    def matches(
        self, wid: str, type: str, status: str, started_ms: int, attrs: Mapping[str, Any] | None
    ) -> bool:
        for name, op, want in self.fields:
            if attrs is not None and name in attrs:
                # The run's own attribute of that name shadows the field for it.
                if not _holds(attrs[name], op, want):
                    return False
                continue
            got: Any = (
                type
                if name == "type"
                else str(status)
                if name == "status"
                else wid
                if name == "id"
                else started_ms
            )
            if not _holds(got, op, want):
                return False
        for name, op, want in self.attrs:
            if attrs is None or name not in attrs or not _holds(attrs[name], op, want):
                return False
        return True


def _field(name: str, value: Any) -> bool:
    """Whether a condition is on the run's own field. `status` is one only for a value a
    run's status can take: `{"status": "paid"}` is about an attribute named status (a run
    is never "paid"), as applications name their own states."""
    if name == "status":
        return value in STATUS_OF
    return name in FIELDS


def _ordered(value: Any) -> bool:
    return (type(value) in _NUMBER) or type(value) is str


def _holds(got: Any, op: str, want: Any) -> bool:
    if op == "eq":
        return _same(got, want)
    if op == "ne":
        return not _same(got, want)
    numbers = type(got) in _NUMBER and type(want) in _NUMBER
    if not numbers and not (type(got) is str and type(want) is str):
        return False
    if op == "gt":
        return bool(got > want)
    if op == "gte":
        return bool(got >= want)
    if op == "lt":
        return bool(got < want)
    return bool(got <= want)


def _same(got: Any, want: Any) -> bool:
    # A bool equals only a bool (JSON keeps true and 1 apart; Python would not).
    if (type(got) is bool) != (type(want) is bool):
        return False
    return bool(got == want)
