"""Bad input to the PostgreSQL store gets a clear error and changes nothing: a `--store`
value that is not a database's URL (random and mutated strings), a database that cannot
be reached, and a database whose fusee rows something other than a fusee server changed
(fusee_meta's numbers, fusee_shards' rows). Each refused start exits with status 2,
names `--store`, prints no traceback, and leaves every row as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fusee_server.postgres.database import check_url
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee._errors import SettingError
from tests.support.postgres import StoreServer
from tests.support.procs import free_port

URLS = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda scheme, rest: f"{scheme}{rest}",
        st.sampled_from(["postgresql://", "postgres://", "postgresql:", "mysql://", "", "file://"]),
        st.text(alphabet="abc:@/?=&%.123 ", max_size=30),
    ),
)


@settings(max_examples=300, deadline=None)
@given(URLS)
def test_any_store_value_is_accepted_as_a_url_or_refused_naming_the_setting(value: str):
    try:
        assert check_url(value) == value
    except SettingError as error:
        assert str(error).startswith(f"--store {value!r}:")


def start(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fusee", "server", "--listen", f"127.0.0.1:{free_port()}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "value, said",
    [
        ("mysql://db/fusee", "expected postgresql://"),
        ("postgresql://127.0.0.1:1", "name the database"),
        ("postgresql://127.0.0.1:1/fusee", "cannot connect"),
    ],
)
def test_a_store_that_is_no_database_or_cannot_be_reached_stops_the_start(value: str, said: str):
    done = start("--store", value)
    assert done.returncode == 2, done.stderr
    assert "--store" in done.stderr and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def rows(postgres, url: str) -> str:
    db = url.rsplit("/", 1)[1]
    return "\n".join(
        postgres.sql(f"SELECT * FROM {table} ORDER BY 1", db)
        for table in ("fusee_meta", "fusee_shards", "fusee_records", "fusee_checkpoints")
    )


@pytest.mark.parametrize(
    "damage, said",
    [
        ("UPDATE fusee_meta SET value = 'four' WHERE key = 'shards'", "fusee_meta's shards is 'four'"),
        ("UPDATE fusee_meta SET value = '0' WHERE key = 'shards'", "a store has 1 to 256"),
        ("UPDATE fusee_meta SET value = 'v1' WHERE key = 'schema_version'", "schema_version is 'v1'"),
        ("DELETE FROM fusee_shards WHERE shard = 2", "fusee_shards is damaged"),
        ("INSERT INTO fusee_shards (shard) VALUES (9)", "fusee_shards is damaged"),
        ("UPDATE fusee_shards SET position = -5 WHERE shard = 1", "negative values in [1]"),
        ("UPDATE fusee_shards SET epoch = -1 WHERE shard = 3", "negative values in [3]"),
    ],
)
def test_a_store_whose_rows_were_changed_outside_fusee_is_refused_and_left_as_it_is(
    postgres, pg_url: str, procs, damage: str, said: str
):
    server = StoreServer(pg_url, free_port())  # the schema made, a run's worth of rows
    server.end()
    db = pg_url.rsplit("/", 1)[1]
    postgres.sql(damage, db)
    before = rows(postgres, pg_url)
    done = start("--store", pg_url)
    assert done.returncode == 2, done.stderr
    assert "--store" in done.stderr and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert rows(postgres, pg_url) == before
