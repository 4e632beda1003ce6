"""`fusee server --unix PATH`: the socket is created 0600 (or `--unix-mode`) whatever the
umask, since its mode decides who on the host may connect; what is at PATH already is
removed only if it is a socket nobody listens on (a server's leftover), never a file or
a live server's socket; a clean stop removes the socket."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import fusee
from tests.support.server_cli import start_fails


@pytest.fixture
def where(tmp_path: Path) -> Iterator[Path]:
    """A socket path that fits in sun_path (108 bytes), which pytest's tmp_path may not."""
    dir = Path("/tmp") / f"fusee-unix-{os.getpid()}-{tmp_path.name[-24:]}"
    dir.mkdir()
    yield dir / "fusee.sock"
    for path in dir.iterdir():
        path.unlink()
    dir.rmdir()


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The umask the server is started under (a child inherits it)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize(("extra", "mode"), [((), 0o600), (("--unix-mode", "660"), 0o660)])
async def test_the_socket_has_its_own_mode_whatever_the_umask(start_server, where, extra, mode):
    with umask(0o000):
        server = start_server("--unix", str(where), *extra, listen="")
    found = os.stat(where)
    assert stat.S_ISSOCK(found.st_mode) and stat.S_IMODE(found.st_mode) == mode
    client = await fusee.Client.connect(f"unix:{where}")
    try:
        with pytest.raises(fusee.NoHolderError):
            await anext(client.list())
    finally:
        await client.close()
    assert server.stop() == 0
    assert not where.exists()  # a clean stop removes it


def test_a_file_at_the_path_is_not_removed(tmp_path, where):
    where.write_text("someone's data\n")
    output = start_fails(tmp_path / "server", "--unix", str(where))
    assert "--unix" in output and "not a socket" in output
    assert where.read_text() == "someone's data\n"


def test_a_live_servers_socket_is_not_taken(start_server, tmp_path, where):
    first = start_server("--unix", str(where), listen="")
    inode = os.stat(where).st_ino
    output = start_fails(tmp_path / "second", "--unix", str(where))
    assert "--unix" in output and "listens" in output
    assert os.stat(where).st_ino == inode  # still the first server's socket
    assert first.popen.poll() is None


async def test_a_stale_socket_is_replaced(start_server, where):
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(where))  # bound, nobody listening: what a SIGKILLed server leaves
    leftover.close()
    start_server("--unix", str(where), listen="")
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o600
    client = await fusee.Client.connect(f"unix:{where}")
    await client.close()


@pytest.mark.parametrize("mode", ["999", "rw", "1777", "0"])
def test_a_wrong_mode_fails_the_start_naming_it(tmp_path, where, mode):
    output = start_fails(tmp_path / "server", "--unix", str(where), "--unix-mode", mode)
    assert f"--unix-mode {mode}:" in output and "octal" in output, output
