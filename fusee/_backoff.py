"""The one backoff of whatever tries again (a client's and a worker engine's connections,
the server's invocations of an endpoint or of a shard): the wait doubles from a first
delay up to a cap, each wait spread by a fifth either way so that processes that lost the
same server do not all come back at the same moment, and a success starts it over.
"""

from __future__ import annotations

import random
from collections.abc import Callable

JITTER = 0.2  # a fifth either way


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
        self.step()
        return self.jittered()

    def step(self) -> float:
        """One step without a draw: the delay doubles (the first delay after a reset), up
        to the cap; it is returned as it is, for a wait that needs no spreading."""
        self.delay_s = min(self.max_s, self.delay_s * 2 or self.first_s)
        return self.delay_s

    def jittered(self) -> float:
        """The current delay, spread by a fifth either way (0 after a reset)."""
        return self.delay_s * (1 + JITTER * (2 * self.draw() - 1))

    def reset(self) -> None:
        """After a success: the next failure waits the first delay again."""
        self.delay_s = 0.0
