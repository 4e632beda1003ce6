import fusee


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    greeting = await ctx.step("compose", lambda: f"hello {name}")
    await ctx.sleep("pause", "5s")
    return greeting


async def test_greet_survives_a_crash(kit):
    t = await kit(greet)
    await t.start(greet, "greet-1", "world")
    await t.settle()
    await t.crash()
    assert await t.result("greet-1") == "hello world"
    assert await t.steps("greet-1") == ["compose"]
    await t.check()
