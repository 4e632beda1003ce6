"""`fusee runs` for its tests: as a real process (`runs`), or in this process on a thread
(`Cli`, the same code without a Python start per call), and the requester it records."""

from __future__ import annotations

import asyncio
import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusee._cli import main
from tests.support.procs import ROOT

BY = f"cli:{getpass.getuser()}"


def runs(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", "runs", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Cli:
    """`fusee runs ...` run in this process, on a thread of its own (the command runs its
    own event loop): the same code as the process, without a Python start per call."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        self.capsys.readouterr()
        argv = ["runs", *map(str, args)]
        code = await asyncio.to_thread(self._main, argv)
        out, err = self.capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    @staticmethod
    def _main(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as exit:  # argparse's refusal of an option
            return int(exit.code or 0)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout
