"""A completion token is keyed by its run's seed, and the seed comes from the operating
system's CSPRNG (`secrets`), not from the `random` module: `random`'s state is the
process's to seed (a test, a library calling `random.seed`), and its Mersenne Twister
outputs predict its next ones, so a seed drawn from it could be recomputed and every
token of the run forged."""

from __future__ import annotations

import random

import fusee
from fusee.engine.tokens import make_token, parse_token

tokens: list[str] = []


@fusee.workflow("tokens-reply")
async def reply(ctx: fusee.Ctx) -> str:
    got: str = await ctx.await_completion("reply", lambda cb: tokens.append(cb.token))
    return got


async def test_a_token_is_not_made_from_the_random_modules_state(kit):
    tokens.clear()
    t = await kit(reply)
    random.seed(1234)
    guesses = [random.getrandbits(63) for _ in range(8)]  # the seeds `random` would give next
    random.seed(1234)
    await t.start(reply, "reply-1")
    await t.settle()
    assert len(tokens) == 1
    wid, run, seq, attempt, _ = parse_token(tokens[0])
    assert all(make_token(wid, run, seq, attempt, seed) != tokens[0] for seed in guesses)
    await t.engine.complete(tokens[0], "yes")  # the genuine token still works
    assert await t.result("reply-1") == "yes"
