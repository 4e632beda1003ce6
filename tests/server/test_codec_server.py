"""`fusee codec-server` refuses a start that could never work, naming the option, before
it listens: a missing keys file, a bad key, an origin with a path, an address beyond
loopback without --insecure (docs/web-ui.md, *Encrypted payloads*)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import ROOT


def codec_server(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", "codec-server", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("keys", "extra", "message"),
    [
        (None, (), "No such file"),
        ("k1 abcd\n", (), "must be 32 bytes"),
        ("just-one-field\n", (), "expected '<key ID> <64 hex digits>'"),
        ("k1 " + "ab" * 32 + "\n", ("--allow-origin", "http://a.example/path"), "no path"),
        ("k1 " + "ab" * 32 + "\n", ("--listen", "0.0.0.0:7602"), "not a loopback address"),
        ("k1 " + "ab" * 32 + "\n", ("--listen", "nowhere"), "expected HOST:PORT"),
    ],
)
def test_a_start_that_could_never_work_is_refused_naming_the_option(tmp_path: Path, keys, extra, message):
    path = tmp_path / "keys.txt"
    if keys is not None:
        path.write_text(keys)
    args = ["--keys-file", path, *extra]
    if "--allow-origin" not in extra:
        args += ["--allow-origin", "http://127.0.0.1:7601"]
    done = codec_server(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "listening" not in done.stderr and "Traceback" not in done.stderr
