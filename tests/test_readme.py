"""The README's first example, run as a new user runs it: a script in an empty directory,
run twice. The second run finds the workflow finished and prints its result again
without running it a second time (one run of the ID, not two)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import fusee
from tests.support.procs import ROOT

README = (ROOT / "README.md").read_text()


def first_example() -> str:
    section = README.split("## A workflow", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the README's *A workflow* section has no python block"
    return found.group(1)


async def test_the_first_example_run_twice_runs_its_workflow_once(tmp_path: Path):
    code = first_example()
    assert '"5s"' in code
    script = tmp_path / "greet.py"
    script.write_text(code.replace('"5s"', '"20ms"'))  # the pause, shortened for the test
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "hello world"
    async with await fusee.Engine.open(str(tmp_path / "data"), workflows=[]) as engine:
        summary = await engine.run("greet-1").status()
    assert summary.run == 1, "the second run of the script started the workflow again"
