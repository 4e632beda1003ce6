"""The README's scale-to-zero demo (examples/scale_to_zero.py) runs as a new user runs it,
a real server, uvicorn and client on loopback, and its checks can fail."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from examples import scale_to_zero as demo

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_runs_its_workflows_and_nothing_runs_while_they_sleep(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "examples/scale_to_zero.py", "--hold-s", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=45,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "client: started 40 workflows: 30 orders that ship at once, 9 that hold 2 s" in out
    assert re.search(r"^invocations: \d+ POSTs to the handler, 1 shard each$", out, re.M), out
    assert re.search(r"^ +\d+\.\d\ds  timer +\d +\d+  \d+ ms$", out, re.M), out
    assert re.search(r"^steps run: 119 \(the server counted 119\)$", out, re.M), out
    assert "runs finished: 40 of 40 (39 orders shipped, refund-01 refunded 500 cents)" in out
    assert re.search(r"^check: while the orders slept .* no worker held a shard: .*: OK$", out, re.M), out
    assert re.search(r"^check: the sleepers were invoked again on time: .*: OK$", out, re.M), out
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone


def test_a_lease_while_the_orders_sleep_fails_the_check(capsys: Any) -> None:
    story = demo.Story(began=100.0, quiet_at=101.0, polls=20)
    woke = demo.Invocation("ab12", 104.0, [0], "timer")
    server = SimpleNamespace(
        lines=[
            (100.5, "... INFO fusee.server: shard 0: leased to worker 127.0.0.1:1 (epoch 7)"),
            (100.8, "... INFO fusee.server: shard 0: released by worker 127.0.0.1:1 (epoch 7)"),
            (102.0, "... INFO fusee.server: shard 3: leased to worker 127.0.0.1:2 (epoch 8)"),
        ]
    )
    handler = SimpleNamespace(lines=[])
    assert demo.check_sleep(story, woke, 104.0, set(), server, handler)  # type: ignore[arg-type]
    assert "no worker held a shard" in capsys.readouterr().out
    server.lines.pop()  # without the lease in the window, the same story passes
    assert demo.check_sleep(story, woke, 104.0, set(), server, handler) == []  # type: ignore[arg-type]
    early = demo.Invocation("cd34", 102.0, [0], "call")  # invoked for something else, early
    assert demo.check_sleep(story, early, 104.0, set(), server, handler)  # type: ignore[arg-type]
    # The handler's line for the timers' own request may arrive before the server's: it
    # is told apart by its ID; a request for any other invocation fails the check.
    handler.lines.append((103.9, "fusee invoke ab12 +0.1ms received shards=[0] reasons=['timer']"))
    assert demo.check_sleep(story, woke, 104.0, {"ab12"}, server, handler) == []  # type: ignore[arg-type]
    handler.lines.append((102.0, "fusee invoke ef56 +0.1ms received shards=[2] reasons=['call']"))
    assert demo.check_sleep(story, woke, 104.0, {"ab12"}, server, handler)  # type: ignore[arg-type]
