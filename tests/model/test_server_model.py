"""The model test in server mode: the state machine of server_model.py, a few short
sequences from a fixed seed by default, more and longer ones with `--run-slow`."""

from __future__ import annotations

import pytest

from .server_model import (
    DEFAULT_EXAMPLES,
    DEFAULT_STEPS,
    DEFAULT_STOPS,
    EXAMPLES,
    SLOW_EXAMPLES,
    SLOW_STEPS,
    SLOW_STOPS,
    STEPS,
    _seed,
    run_server_model,
)


@pytest.mark.timeout(600)
def test_server_model() -> None:
    run_server_model(EXAMPLES or DEFAULT_EXAMPLES, STEPS or DEFAULT_STEPS, _seed(slow=False), DEFAULT_STOPS)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_server_model_long() -> None:
    run_server_model(EXAMPLES or SLOW_EXAMPLES, STEPS or SLOW_STEPS, _seed(slow=True), SLOW_STOPS)
