"""The one backoff of the connections that try again (a client's, a worker engine's): the
wait doubles from a first delay up to a cap, each wait spread by a fifth either way so
that processes that lost the same server do not all come back at the same moment, and
a success starts it over.
"""

from __future__ import annotations

import random
from collections.abc import Callable

JITTER = 0.2  # a fifth either way, as the server's invoker spreads its own


class Backoff:
    def __init__(self, first_s: float, max_s: float, draw: Callable[[], float] = random.random) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"Backoff({first_s!r}, {max_s!r}): expected 0 < first <= max")
        self.first_s = first_s
        self.max_s = max_s
        self.draw = draw  # in [0, 1]: 0.5 is the delay itself
        self.delay_s = 0.0

    def next(self) -> float:
        """The wait before the next attempt (after a failure, or before the first retry)."""
        self.delay_s = min(self.max_s, self.delay_s * 2 or self.first_s)
        return self.delay_s * (1 + JITTER * (2 * self.draw() - 1))

    def reset(self) -> None:
        """After a success: the next failure waits the first delay again."""
        self.delay_s = 0.0
