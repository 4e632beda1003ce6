"""Patches: `ctx.patched(id)` and `ctx.deprecate_patch(id)` (docs/engine.md, *Patching*).

A patch lets one function hold the old and the new code of a change, so runs that went
past the change under the old code replay the old branch, and every other run takes
the new one. The choice is made once per run and patch:

- a `Patched` marker in the journal: the run took the new branch before, it does again;
- on replay, the journal holds an operation at this position or later, or the run's
  end: the old code went past this point without the patch, so the old branch;
- otherwise (live, or a replay whose journal stops before this point): the new branch,
  and a marker is recorded so every later replay takes it too.

The marker has no position (`R.Patched` has no `seq`), so adding or removing a patch
never shifts the positions that replay compares. A marker chosen during a replay is
recorded when the run goes live, after the journal's last record: appended in the middle
of the replay it would sit in the run's journal ahead of records the log holds before it.
"""

from __future__ import annotations

from typing import Protocol

from fusee import journal as R


class RunState(Protocol):
    """What of a run (fusee/engine/run.py) its patches read and change."""

    patches: dict[str, bool] | None
    markers_due: list[str] | None
    replay_horizon: int
    replaying: bool
    next_seq: int

    def record(self, rec: R.Rec) -> None: ...


# The replay horizon of a journal that records the run's end: past every position.
ENDED = 1 << 62


def patched(run: RunState, patch: str) -> bool:
    """Whether the run takes patch `patch`'s new branch (see the module's docstring)."""
    chosen = run.patches
    if chosen is None:
        chosen = run.patches = {}
    else:
        known = chosen.get(patch)
        if known is not None:
            return known
    if run.replaying and run.next_seq < run.replay_horizon:
        chosen[patch] = False
        return False
    chosen[patch] = True
    if not run.replaying:
        run.record(R.Patched(patch))
    elif run.markers_due is None:
        run.markers_due = [patch]
    else:
        run.markers_due.append(patch)
    return True


def record_due(run: RunState) -> None:
    """The markers chosen during the replay, recorded now that the run goes live."""
    due, run.markers_due = run.markers_due, None
    for patch in due or ():
        run.record(R.Patched(patch))
