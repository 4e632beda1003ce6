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


@fusee.workflow("raw")
async def raw(ctx: fusee.Ctx, blob: bytes) -> bytes:
    doubled = await ctx.step("double", lambda: blob * 2)
    await ctx.sleep("pause", "1s")
    return doubled


async def test_bytes_are_recorded_raw_and_come_back_as_bytes(kit):
    t = await kit(raw)
    await t.start(raw, "raw-1", b"\x00\xffab")
    await t.settle()
    await t.crash()
    assert await t.result("raw-1") == b"\x00\xffab\x00\xffab"
    journal = (await t.engine.run("raw-1").describe()).journal
    step = next(r for r in journal if type(r).__name__ == "StepDone")
    assert step.value == b"\x00" + b"\x00\xffab\x00\xffab"  # a NUL marks raw bytes; no JSON, no base64
    await t.check()
