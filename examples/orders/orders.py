"""An order, the workflow app that examples/lambda and examples/cloudrun deploy.

Reserve the stock, charge the card (retried while the payment provider is flaky),
wait out a cooling-off period (a durable sleep: no process exists meanwhile), then wait
for the warehouse's `shipped` signal. If the charge is declined or the warehouse does not
ship in time, what was done is undone, newest first: the charge refunded, the stock
released.

The step functions stand in for calls to other systems (a stock service, a payment
provider); they are plain functions here so that the app runs anywhere without
credentials. Everything a step returns is recorded, so a retried or resumed run never
charges twice.

Deployed with `FUSEE_WORKFLOWS=orders` (this directory on the path).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta

import fusee

shipped = fusee.signal("shipped", str)  # the warehouse's tracking number


@dataclass
class Order:
    order_id: str
    item: str
    quantity: int
    card: str = "4242"  # "declined": the charge fails for good; "flaky": it fails twice first
    cooling_off_s: float = 0.0  # how long the customer may still cancel for free
    ship_within_s: float = 3600.0  # how long the warehouse has to ship


@dataclass
class Outcome:
    order_id: str
    status: str  # "shipped", "declined" or "not shipped"
    charged_cents: int = 0
    tracking: str | None = None
    undone: list[str] = field(default_factory=list)  # compensations, in the order they ran


PRICE_CENTS = 1250


class Declined(fusee.Fatal):
    """The card was refused: retrying cannot help."""


class ProviderBusy(Exception):
    """The payment provider's transient failure: retried by the step's policy."""


def reserve(o: Order) -> str:
    return f"res-{_digest(o.order_id, 'reserve')}"


def charge(o: Order, s: fusee.StepContext) -> dict[str, object]:
    if o.card == "declined":
        raise Declined(f"card {o.card} refused for order {o.order_id}")
    if o.card == "flaky" and s.attempt < 3:
        raise ProviderBusy(f"payment provider busy (attempt {s.attempt})")
    return {"payment": f"pay-{_digest(o.order_id, 'charge')}", "cents": o.quantity * PRICE_CENTS}


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


CHARGE_RETRY = fusee.Retry(attempts=5, initial="200ms", max="2s")  # (Declined is never retried)


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, o: Order) -> Outcome:
    undo: list[tuple[str, object]] = []  # (compensation step, what it undoes), newest last
    outcome = Outcome(o.order_id, "shipped")
    reservation = await ctx.step("reserve", lambda: reserve(o))
    undo.append(("release", reservation))
    try:
        paid = await ctx.step("charge", lambda s: charge(o, s), retry=CHARGE_RETRY)
    except fusee.StepError:
        outcome.status = "declined"
        await _compensate(ctx, undo, outcome)
        return outcome
    outcome.charged_cents = int(paid["cents"])
    undo.append(("refund", paid["payment"]))
    if o.cooling_off_s:
        await ctx.sleep("cooling-off", timedelta(seconds=o.cooling_off_s))
    tracking = await ctx.wait_for(shipped, timeout=timedelta(seconds=o.ship_within_s))
    if tracking is None:
        outcome.status = "not shipped"
        await _compensate(ctx, undo, outcome)
        return outcome
    outcome.tracking = tracking
    return outcome


async def _compensate(ctx: fusee.Ctx, undo: list[tuple[str, object]], outcome: Outcome) -> None:
    for name, what in reversed(undo):
        await ctx.step(name, lambda what=what, name=name: f"{name} {what}")
        outcome.undone.append(name)
