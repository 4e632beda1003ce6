"""Golden journals: recorded runs kept in tests/engine/golden/ and replayed against today's code on
every test run, so a change that would strand running workflows fails here first.

Each file is `{"id": ..., "workflow": <type>, "journal": [rows]}` with rows as
`fusee.engine.replay.journal_to_json` writes them. They were made by running the workflows of
tests/support/golden.py once on a TestEngine; to make them again (only when a change is
meant to break old runs):

    python -m tests.engine.test_golden --write

`nondeterministic.json` is recorded from an older `g_pay` that called step 'charge' where
today's code calls 'refund': replaying it must fail and name both.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.engine.replay import Replayer, journal_from_json, journal_to_json
from tests.support.golden import (
    GOLDEN,
    NONDETERMINISTIC,
    REPAIRED,
    add_item,
    approve,
    flaky_charge,
    g_approval,
    g_child,
    g_parent,
    g_patch,
    g_pay,
    g_repair,
    g_retry,
    g_tab,
)

WORKFLOWS = [g_retry, g_approval, g_child, g_parent, g_pay, g_repair, g_patch, g_tab]
FILES = sorted(GOLDEN.glob("*.json"))
DETERMINISTIC = [path for path in FILES if path.name != NONDETERMINISTIC]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_golden_set_is_there():
    assert {path.name for path in FILES} == {
        "retry_sleep.json",
        "signal_update.json",
        "child.json",
        "repair.json",
        "patched.json",
        "object.json",
        NONDETERMINISTIC,
    }
    for path in FILES:
        document = _load(path)
        assert set(document) == {"id", "workflow", "journal"}
        assert document["journal"][0]["kind"] == "Started"
        assert document["journal"][0]["type"] == document["workflow"]


def test_the_goldens_cover_the_operations():
    kinds = {row["kind"] for path in DETERMINISTIC for row in _load(path)["journal"]}
    assert kinds >= {
        "Started",
        "StepDone",
        "Attempt",
        "TimerStarted",
        "TimerFired",
        "WaitStarted",
        "SignalReceived",
        "UpdateAccepted",
        "UpdateDone",
        "ChildRequested",
        "ChildStarted",
        "ChildResult",
        "Finished",
    }
    repair = _load(GOLDEN / "repair.json")["journal"]
    assert {"Reset", "Resume"} <= {row["kind"] for row in repair}
    assert [row.get("paused", False) for row in repair if row["kind"] == "Attempt"] == [False, True]
    patched = _load(GOLDEN / "patched.json")["journal"]
    assert [row["id"] for row in patched if row["kind"] == "Patched"] == ["express"]
    assert [row["name"] for row in patched if row["kind"] == "StepDone"] == ["pack", "ship-express"]
    tab = _load(GOLDEN / "object.json")["journal"]
    assert tab[0]["update_name"] == "order"  # the first call rides in the start record
    assert [row["name"] for row in tab if row["kind"] == "UpdateAccepted"] == [
        "order",
        "fusee.state.edit",
        "total",
    ]
    assert [row["name"] for row in tab if row["kind"] == "StepDone"] == ["price", "price"]
    attempts = [r for r in _load(GOLDEN / "retry_sleep.json")["journal"] if r["kind"] == "Attempt"]
    assert [r["attempt"] for r in attempts] == [1, 2]
    assert all("card network down" in r["failure"]["message"] for r in attempts)


@pytest.mark.parametrize("path", DETERMINISTIC, ids=lambda p: p.name)
def test_golden_replays_against_the_code(path):
    Replayer(WORKFLOWS).replay_file(str(path))


def test_nondeterministic_golden_names_both_steps():
    with pytest.raises(fusee.DeterminismError) as caught:
        Replayer(WORKFLOWS).replay_file(str(GOLDEN / NONDETERMINISTIC))
    message = str(caught.value)
    assert "recorded step 'charge' here but the code called step 'refund'" in message
    assert _load(GOLDEN / NONDETERMINISTIC)["id"] in message


def test_a_changed_workflow_fails_its_golden():
    """The goldens guard the code: a renamed step in g_retry no longer replays."""

    @fusee.workflow("g_retry")
    async def renamed(ctx: fusee.Ctx, order: str) -> str:
        charge = await ctx.step("charge_card", flaky_charge)
        await ctx.sleep("cooldown", "1m")
        return charge

    others = [wf for wf in WORKFLOWS if wf.name != "g_retry"]
    with pytest.raises(
        fusee.DeterminismError, match="recorded step 'charge' here but the code called step 'charge_card'"
    ):
        Replayer([renamed, *others]).replay_file(str(GOLDEN / "retry_sleep.json"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_golden_journal_round_trips(path):
    rows = _load(path)["journal"]
    records = journal_from_json(rows)
    assert [type(r).__name__ for r in records] == [row["kind"] for row in rows]
    assert json.loads(json.dumps(journal_to_json(records))) == rows


@fusee.workflow("g_plain")
async def g_plain(ctx: fusee.Ctx) -> None:
    stamp = ctx.now()
    ident = ctx.uuid()
    await ctx.step("notify", lambda: None)
    await ctx.wait_for("poke")
    await ctx.step("log", lambda: [stamp.isoformat(), str(ident)])


async def test_null_payloads_and_drawn_values_round_trip(kit):
    """No input, a step and a signal with no value, a None result, now() and uuid():
    the JSON form of such a journal decodes back to the same records and replays."""
    t = await kit(g_plain)
    await t.start(g_plain, "plain-1")
    await t.settle()
    await t.engine.run("plain-1").signal("poke")
    assert await t.result("plain-1") is None
    records = (await t.engine.run("plain-1").describe()).journal
    rows = await t.journal("plain-1")
    assert journal_from_json(rows) == records
    Replayer([g_plain]).replay(journal_from_json(rows))


# -- the generator, run by hand -------------------------------------------------------------------


def _strip_stacks(value: Any) -> Any:
    """Stacks hold this machine's paths; the goldens keep the rest of each failure."""
    if isinstance(value, dict):
        return {k: _strip_stacks(v) for k, v in value.items() if k != "stack"}
    if isinstance(value, list):
        return [_strip_stacks(v) for v in value]
    return value


async def _write() -> None:
    from fusee.testing import TestEngine

    @fusee.workflow("g_pay")
    async def g_pay_before(ctx: fusee.Ctx, amount: int) -> str:
        return await ctx.step("charge", lambda: f"charged {amount}")

    t = await TestEngine.open(workflows=[g_retry, g_approval, g_child, g_parent, g_pay_before])
    await t.start(g_retry, "golden-retry", "order-7")
    await t.result("golden-retry")
    run = await t.start(g_approval, "golden-approval", "ann")
    await t.settle()
    assert await run.update(add_item, "pen") == 1
    assert await run.update(add_item, "ink") == 2
    await run.signal(approve, True)
    await t.result("golden-approval")
    await t.start(g_parent, "golden-parent", 6)
    assert await t.result("golden-parent") == 37
    await t.start(g_pay_before, "golden-pay", 12)
    await t.result("golden-pay")
    files = {
        "retry_sleep.json": ("golden-retry", "g_retry"),
        "signal_update.json": ("golden-approval", "g_approval"),
        "child.json": ("golden-parent", "g_parent"),
        NONDETERMINISTIC: ("golden-pay", "g_pay"),
    }
    GOLDEN.mkdir(exist_ok=True)
    await _write_repair(t)
    for name, (wid, workflow) in files.items():
        journal = _strip_stacks(await t.journal(wid))
        document = {"id": wid, "workflow": workflow, "journal": journal}
        (GOLDEN / name).write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {GOLDEN / name} ({len(journal)} records)")
    await t.close()


async def _write_repair(t: Any = None) -> None:
    """repair.json: g_repair paused, reset by 'cli:bob' to before its charge, paused
    again, then resumed by 'ops:ana' once fixed; the journal of its second run."""
    from fusee.testing import TestEngine

    own = t is None
    if own:
        t = await TestEngine.open(workflows=[g_repair])
    REPAIRED[0] = False
    run = await t.start(g_repair, "golden-repair", "order-9")
    await t.settle()
    with fusee.as_requester("ops:ana"):
        await run.signal(approve, True)
    await t.advance("1s")
    with fusee.as_requester("cli:bob"):
        await run.reset("charge")
    await t.advance("1s")
    REPAIRED[0] = True
    with fusee.as_requester("ops:ana"):
        await run.resume()
    assert await t.result("golden-repair") == "prepared:order-9/True/ch_2"
    journal = _strip_stacks(await t.journal("golden-repair"))
    document = {"id": "golden-repair", "workflow": "g_repair", "journal": journal}
    (GOLDEN / "repair.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {GOLDEN / 'repair.json'} ({len(journal)} records)")
    if own:
        await t.close()


async def _write_patched() -> None:
    """patched.json: a g_patch run started under the code before its patches, asleep
    through the deploy of g_patch, then woken: the old branch of 'gift', the new one of
    'express'."""
    from fusee.testing import TestEngine

    @fusee.workflow("g_patch")
    async def g_patch_before(ctx: fusee.Ctx, parcel: str) -> str:
        packed = await ctx.step("pack", lambda: f"packed {parcel}")
        await ctx.sleep("wait-for-truck", "1h")
        return f"{packed}/{await ctx.step('ship', lambda: 'standard')}"

    t = await TestEngine.open(workflows=[g_patch_before])
    await t.start(g_patch_before, "golden-patch", "book")
    await t.settle()
    t.workflows = [g_patch]
    await t.crash()
    await t.advance("1h")
    assert await t.result("golden-patch") == "packed book/express"
    journal = _strip_stacks(await t.journal("golden-patch"))
    document = {"id": "golden-patch", "workflow": "g_patch", "journal": journal}
    (GOLDEN / "patched.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {GOLDEN / 'patched.json'} ({len(journal)} records)")
    await t.close()


async def _write_object() -> None:
    """object.json: the run of a g_tab key: two calls, an edit from outside, a shared read."""
    from fusee.testing import TestEngine

    t = await TestEngine.open(workflows=[g_tab], park_after="1h")
    ref = t.engine.object("g_tab", "table-4")
    assert await ref.call("order", "tea", id="o-1") == 1
    assert await ref.call("order", "cake", id="o-2") == 2
    with fusee.as_requester("cli:ana"):
        await ref.set_state(
            "note",
            "window seat",
        )
    assert await ref.call("total") == 7
    journal = _strip_stacks(await t.journal(ref.id))
    document = {"id": ref.id, "workflow": "g_tab", "journal": journal}
    (GOLDEN / "object.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {GOLDEN / 'object.json'} ({len(journal)} records)")
    await t.close()


if __name__ == "__main__" and "--write" in sys.argv:
    asyncio.run(_write())
    asyncio.run(_write_patched())
    asyncio.run(_write_object())
elif __name__ == "__main__" and "--write-object" in sys.argv:  # only the file added last
    asyncio.run(_write_object())
elif __name__ == "__main__" and "--write-repair" in sys.argv:
    asyncio.run(_write_repair())
elif __name__ == "__main__" and "--write-patched" in sys.argv:
    asyncio.run(_write_patched())
