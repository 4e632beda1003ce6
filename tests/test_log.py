"""fusee/_log.py: the trace's one rule, and the rate limit both refusal loggers use."""

from __future__ import annotations

import logging

import pytest

from fusee._log import RateLimit, rate_limited, trace_enabled


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("", False), ("0", False), (" 0 ", False), ("1", True), ("yes", True)]
)
def test_the_trace_is_on_unless_unset_empty_or_0(value: str | None, on: bool) -> None:
    assert trace_enabled({} if value is None else {"FUSEE_INVOKE_TRACE": value}) is on


def test_a_rate_limit_lets_one_line_through_a_period_and_counts_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    limit = RateLimit(10.0, "refused", clock=lambda: now[0])
    limited = rate_limited(logging.getLogger("fusee.test.limited"), limit)
    with caplog.at_level(logging.WARNING, "fusee.test.limited"):
        for reason in ("a", "b", "c"):
            limited.warning("refused %s", reason)
        now[0] += 10.0
        limited.warning("refused %s", "d")
    assert [r.getMessage() for r in caplog.records] == [
        "refused a",
        "refused d (2 more refused since the last line)",
    ]
    assert {r.name for r in caplog.records} == {"fusee.test.limited"}


def test_each_owner_has_its_own_limit(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("fusee.test.owners")
    first, second = (rate_limited(logger, RateLimit(10.0, "refused")) for _ in range(2))
    with caplog.at_level(logging.WARNING, "fusee.test.owners"):
        first.warning("one")
        second.warning("two")
        first.warning("dropped")
    assert [r.getMessage() for r in caplog.records] == ["one", "two"]
