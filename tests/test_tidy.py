"""Tidy: workflow-facing code never reads the clock or randomness directly (a replay
would see other values), and no fix-me marker is left behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What workflow code calls into: the context, operations, the run's scheduler, definitions.
WORKFLOW_FACING = [
    "fusee/workflow/ctx.py",
    "fusee/workflow/ops.py",
    "fusee/engine/run.py",
    "fusee/workflow/definitions.py",
]
FORBIDDEN = re.compile(r"\btime\.time\b|^\s*import random\b|\brandom\.|\buuid4\b|\basyncio\.sleep\b")
ALLOW = "# tidy: recorded"


def test_workflow_facing_code_draws_nothing_unrecorded() -> None:
    offenders = []
    for name in WORKFLOW_FACING:
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if FORBIDDEN.search(line) and ALLOW not in line:
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "clock or randomness outside the journal:\n" + "\n".join(offenders)


def test_no_fixme_left() -> None:
    marker = "FIX" + "ME"
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("fusee", "tests", "bench", "examples")
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line
    ]
    assert not found, f"leftover {marker}: {found}"


def test_the_tidy_check_catches_a_clock_read() -> None:
    assert FORBIDDEN.search("    now = time.time()")
    assert FORBIDDEN.search("import random")
    assert FORBIDDEN.search("    await asyncio.sleep(1)")
    assert not FORBIDDEN.search("    return self._draw('random', _random_module.random)")
