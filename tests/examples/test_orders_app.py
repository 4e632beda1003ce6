"""The order app that examples/lambda and examples/cloudrun deploy, on the test kit's
virtual clock: each of its three endings, with a crash in the middle of each."""

from __future__ import annotations

import sys
from pathlib import Path

from fusee.testing import TestEngine

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "orders"))
import orders


async def test_a_flaky_provider_is_retried_and_the_order_ships() -> None:
    t = await TestEngine.open(workflows=[orders.order])
    o = orders.Order("o1", "lamp", 2, card="flaky", cooling_off_s=5, ship_within_s=60)
    await t.start(orders.order, "o1", o)
    await t.advance("10s")  # the retries and the cooling-off period pass
    await t.crash()
    await t.engine.run("o1").signal(orders.shipped, "TRK1")
    result = await t.result("o1")
    assert (result.status, result.tracking, result.charged_cents) == ("shipped", "TRK1", 2500)
    assert await t.steps("o1") == ["reserve", "charge"]
    await t.check()
    await t.close()


async def test_a_declined_card_releases_the_stock_without_retrying() -> None:
    t = await TestEngine.open(workflows=[orders.order])
    await t.start(orders.order, "o2", orders.Order("o2", "lamp", 1, card="declined"))
    result = await t.result("o2")
    assert (result.status, result.charged_cents, result.undone) == ("declined", 0, ["release"])
    journal = await t.journal("o2")
    assert sum(1 for rec in journal if "charge" in str(rec) and "Attempt" in str(rec)) <= 1
    await t.check()
    await t.close()


async def test_an_order_not_shipped_in_time_is_refunded_then_released() -> None:
    t = await TestEngine.open(workflows=[orders.order])
    await t.start(orders.order, "o3", orders.Order("o3", "lamp", 1, ship_within_s=30))
    await t.crash()
    result = await t.result("o3")  # the virtual clock skips the 30 s
    assert (result.status, result.undone) == ("not shipped", ["refund", "release"])
    assert await t.steps("o3") == ["reserve", "charge", "refund", "release"]
    await t.check()
    await t.close()
