"""`crash_everywhere` (the test kit, spec docs/15): a step that is not idempotent is named
with both sets of effects; one that passes its idempotency key passes."""

from __future__ import annotations

import pytest

import fusee
from fusee.testing import Case, crash_everywhere


class FakePayments:
    """A payment service: charges by idempotency key when given one."""

    def __init__(self) -> None:
        self.charges: list[int] = []
        self.keys: set[str] = set()

    def charge(self, cents: int, key: str | None = None) -> str:
        if key is not None and key in self.keys:
            return f"ch_{self.charges.index(cents) + 1}"
        if key is not None:
            self.keys.add(key)
        self.charges.append(cents)
        return f"ch_{len(self.charges)}"


def checkout_with(payments: FakePayments, use_key: bool) -> fusee.Workflow:
    @fusee.workflow("checkout")
    async def checkout(ctx: fusee.Ctx, cents: int) -> str:
        quote = await ctx.step("quote", lambda: cents + 50)
        charge = await ctx.step("charge", lambda s: payments.charge(quote, s.key if use_key else None))
        await ctx.sleep("settle", "1h")
        receipt: str = await ctx.step("receipt", lambda: f"receipt for {charge}")
        return receipt

    return checkout


def build(use_key: bool):
    def make() -> Case:
        payments = FakePayments()
        return Case(
            workflows=[checkout_with(payments, use_key)],
            workflow="checkout",
            id="order-1",
            input=500,
            effects=lambda: list(payments.charges),
        )

    return make


async def test_a_step_without_an_idempotency_key_is_named_with_both_effects():
    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(build(use_key=False))
    message = str(caught.value)
    assert "step 'charge' (step 2 of 3)" in message
    assert "[550]" in message and "[550, 550]" in message


async def test_a_step_that_passes_its_key_survives_a_crash_anywhere():
    assert await crash_everywhere(build(use_key=True)) == ["quote", "charge", "receipt"]
