"""The one backoff (fusee/_backoff.py): doubling to a cap, a fifth of jitter either way,
and a reset after a success."""

from __future__ import annotations

import pytest

from fusee._backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset():
    middle = Backoff(0.1, 0.5, draw=lambda: 0.5)  # no spread at the middle of the draw
    assert [round(middle.next(), 6) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    middle.reset()
    assert middle.next() == pytest.approx(0.1)


def test_each_delay_is_spread_by_a_fifth_either_way():
    assert Backoff(1.0, 1.0, draw=lambda: 0.0).next() == pytest.approx(0.8)
    assert Backoff(1.0, 1.0, draw=lambda: 1.0).next() == pytest.approx(1.2)
    drawn = [Backoff(1.0, 1.0).next() for _ in range(200)]
    assert all(0.8 <= d <= 1.2 for d in drawn) and len(set(drawn)) > 100  # not all in step


def test_nonsense_settings_are_refused():
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)
