"""The model test in server mode: the state machine of server_model.py, a few short
sequences from a fixed seed by default, more and longer ones with `--run-slow`; and the same on the PostgreSQL store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.postgres import Postgres

from .server_model import (
    DEFAULT_EXAMPLES,
    DEFAULT_STEPS,
    DEFAULT_STOPS,
    EXAMPLES,
    PG_EXAMPLES,
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


@pytest.fixture(scope="module")
def model_database(postgres: Any) -> Iterator[Postgres]:
    """A PostgreSQL cluster of the model's own: its moves SIGKILL the postmaster, which the
    session's cluster (`postgres`, asked for so a missing PostgreSQL fails in CI) must not
    see."""
    cluster = Postgres().init(fsync="on", synchronous_commit="on").start()
    yield cluster
    cluster.remove()


@pytest.mark.timeout(600)
def test_server_model_on_postgresql(model_database: Postgres) -> None:
    """The same machine against two servers on the PostgreSQL store, with the owner's
    SIGKILL and SIGSTOP and the database's restart as moves."""
    run_server_model(
        EXAMPLES or PG_EXAMPLES,
        STEPS or DEFAULT_STEPS,
        _seed(slow=False),
        DEFAULT_STOPS,
        lambda: (model_database, model_database.database()),
    )


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_server_model_on_postgresql_long(model_database: Postgres) -> None:
    run_server_model(
        EXAMPLES or SLOW_EXAMPLES,
        STEPS or SLOW_STEPS,
        _seed(slow=True),
        SLOW_STOPS,
        lambda: (model_database, model_database.database()),
    )
