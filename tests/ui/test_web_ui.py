"""The web UI (docs/web-ui.md) in headless chromium: the runs list with its filters and
pages, a run's page with its journal, each button acting through `/v1`, the server's
pages, and every user string shown as text."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from playwright.async_api import expect

from tests.support.http import path_id
from tests.ui.conftest import Ui

ORDER = {"item": "pen", "quantity": 2}
SCREENSHOT = os.environ.get("FUSEE_UI_SCREENSHOT")  # where to save a run page's picture


async def start(ui: Ui, type: str, id: str, input: object) -> None:
    await ui.api.ok("POST", "/v1/runs", {"type": type, "id": id, "input": input})


async def ended(ui: Ui, id: str) -> dict:
    return await ui.api.ok("GET", f"/v1/runs/{path_id(id)}/result", wait="10000")


async def test_list_open_a_run_see_its_journal_and_signal_it_to_the_end(ui):
    await start(ui, "checkout", "co/1", ORDER)
    await ui.api.ok("POST", f"/v1/runs/{path_id('co/1')}/updates/note", {"arg": "gift wrap"})
    page = ui.page
    await page.goto(ui.url + "/")
    await expect(page.locator("#runs a.run-link")).to_have_text(["co/1"])
    await page.click("text=co/1")
    await expect(page.locator("#run-id")).to_have_text("co/1")
    await expect(page.locator("#status")).to_have_text("running")
    await expect(page.locator("#input")).to_contain_text('"item": "pen"')
    journal = page.locator("#journal li .kind")
    await expect(journal).to_have_text(["Started", "WaitStarted", "UpdateAccepted", "UpdateDone"])
    page_loads = []
    page.on("load", lambda _: page_loads.append(1))
    await expect(page.locator("#updates")).to_contain_text("gift wrap")
    # Sent elsewhere while the page is open: the page polls, and shows it without a reload.
    await ui.api.ok("POST", f"/v1/runs/{path_id('co/1')}/updates/note", {"arg": "by phone"})
    await expect(page.locator("#updates")).to_contain_text("by phone")
    assert not page_loads

    await page.fill("form[data-action=signal] input[name=name]", "review")
    await page.fill("form[data-action=signal] input[name=value]", "true")
    await page.click("text=Send signal")
    await expect(page.locator("#message")).to_have_text("signal: done")
    # The live part refreshes: the run ends without reloading the page.
    await expect(page.locator("#status")).to_have_text("ok")
    await expect(page.locator("#result")).to_contain_text('"approved": true')
    await expect(page.locator("#signals tr.signal")).to_have_count(1)
    await expect(page.locator("#signals .by")).to_have_text("http")  # who sent it
    await expect(page.locator("#steps tr.step")).to_contain_text(["ship"])
    assert (await ended(ui, "co/1"))["result"]["approved"] is True  # the API agrees
    assert not ui.errors


async def test_retry_a_failed_run_after_the_fix(ui):
    await start(ui, "flaky", "pay-1", False)
    assert (await ended(ui, "pay-1"))["status"] == "failed"
    page = ui.page
    await page.goto(f"{ui.url}/runs/{path_id('pay-1')}")
    await expect(page.locator("#status")).to_have_text("failed")
    charge = page.locator("#steps tr.step", has_text="charge")
    await expect(charge.locator(".attempt")).to_have_count(2)  # each attempt and its error
    await expect(charge).to_contain_text("payments are down")
    await expect(page.locator("#failure")).to_contain_text("payments are down")
    if SCREENSHOT:  # the failed run: its attempts and errors
        await page.screenshot(path=SCREENSHOT, full_page=True)

    Path(str(ui.steps) + ".fixed").write_text("")  # the fix is deployed
    await page.click("form[data-action=retry] button")
    await expect(page.locator("#message")).to_have_text("retry: done (run 2)")
    await expect(page.locator("#status")).to_have_text("ok")
    await expect(page.locator("#result")).to_have_text('"charged"')
    await expect(page.locator("#audit")).to_contain_text("by http")
    if SCREENSHOT:  # and once retried
        await page.screenshot(path=SCREENSHOT.replace(".png", "-retried.png"), full_page=True)
    assert not ui.errors


async def test_resume_a_paused_run_terminate_cancel_and_reset(ui):
    await start(ui, "flaky", "pause-1", True)
    page = ui.page
    await page.goto(f"{ui.url}/runs/{path_id('pause-1')}")
    await expect(page.locator("#status")).to_have_text("paused")
    Path(str(ui.steps) + ".fixed").write_text("")
    await page.click("form[data-action=resume] button")
    await expect(page.locator("#status")).to_have_text("ok")

    await start(ui, "waiter", "wait-1", 1)
    await page.goto(f"{ui.url}/runs/{path_id('wait-1')}")
    await page.fill("form[data-action=terminate] input[name=reason]", "stuck order")
    await page.click("form[data-action=terminate] button")  # confirmed (conftest)
    await expect(page.locator("#status")).to_have_text("terminated")

    await start(ui, "waiter", "wait-2", 1)
    await page.goto(f"{ui.url}/runs/{path_id('wait-2')}")
    await page.fill("form[data-action=cancel] input[name=reason]", "not needed")
    await page.click("form[data-action=cancel] button")
    await expect(page.locator("#status")).to_have_text("cancelled")
    await expect(page.locator("#audit")).to_contain_text("cancel by http: not needed")

    await start(ui, "steps", "st-1", 3)
    assert (await ended(ui, "st-1"))["status"] == "ok"
    await page.goto(f"{ui.url}/runs/{path_id('st-1')}")
    await page.select_option("form[data-action=reset] select", "s1")
    await page.click("form[data-action=reset] button")
    await expect(page.locator("#message")).to_have_text("reset: done (run 2)")
    await expect(page.locator("#status")).to_have_text("ok")
    described = await ui.api.ok("GET", f"/v1/runs/{path_id('st-1')}")
    assert described["run"] == 2
    # A refusal is shown, not swallowed: a payload that is not JSON never leaves the page.
    await page.fill("form[data-action=signal] input[name=name]", "go")
    await page.fill("form[data-action=signal] input[name=value]", "{nope")
    await page.click("text=Send signal")
    await expect(page.locator("#message")).to_contain_text("not JSON")
    await page.fill("form[data-action=signal] input[name=value]", "1")
    await page.click("text=Send signal")  # the run has ended: the API's refusal, shown
    await expect(page.locator("#message.error")).to_contain_text("signal:")
    assert not ui.errors


async def test_filters_and_pages(ui):
    ids = [f"acme/{i:02}" for i in range(7)] + ["globex/1"]
    await asyncio.gather(*(start(ui, "waiter", id, 1) for id in ids))
    await start(ui, "steps", "acme/steps", 1)
    await ended(ui, "acme/steps")
    page = ui.page
    await page.goto(ui.url + "/?limit=3")
    seen: list[str] = []
    while True:
        seen += await page.locator("#runs a.run-link").all_inner_texts()
        if not await page.locator("#next-page").count():
            break
        await page.click("#next-page")
    assert seen == sorted([*ids, "acme/steps"])  # every run once, in ID order, 3 a page
    await expect(page.locator("#first-page")).to_be_visible()

    await page.goto(ui.url + "/")
    await page.fill("input[name=prefix]", "acme/")
    await page.select_option("select[name=status]", "running")
    await page.click("text=Filter")
    links = page.locator("#runs a.run-link")
    await expect(links).to_have_count(7)
    await page.fill("input[name=type]", "steps")
    await page.select_option("select[name=status]", "ok")
    await page.click("text=Filter")
    await expect(links).to_have_text(["acme/steps"])
    await page.fill("input[name=prefix]", "nobody/")
    await page.click("text=Filter")
    await expect(page.locator("#runs .empty")).to_contain_text("No runs match")
    assert not ui.errors


async def test_every_user_string_is_text(ui):
    """An ID, input, signal name and value, and reason holding markup render as text:
    nothing of them runs, and they read back exactly."""
    evil = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
    await start(ui, "collector", evil, 0)
    await ui.api.ok("POST", f"/v1/runs/{path_id(evil)}/signals/go", {"value": 5})
    await start(ui, "checkout", "co-evil", {"item": evil, "quantity": 1})
    page = ui.page
    await page.goto(ui.url + "/")
    await expect(page.locator("#runs a.run-link").first).to_have_text(evil)
    await page.locator("#runs a.run-link").first.click()
    await expect(page.locator("#run-id")).to_have_text(evil)
    await expect(page.locator("#signals tr.signal")).to_have_count(1)
    await page.fill("form[data-action=cancel] input[name=reason]", evil)
    await page.click("form[data-action=cancel] button")
    await expect(page.locator("#audit")).to_contain_text(evil)
    await page.goto(f"{ui.url}/runs/co-evil")
    await expect(page.locator("#input")).to_contain_text(json.dumps(evil))  # as JSON text
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#live img, #live script, main h1 script").count() == 0
    _, html = await ui.api.get("/runs/co-evil")
    assert "<img src=x" not in html and "&lt;img src=x" in html
    assert not ui.errors


async def test_shards_invocations_and_an_unknown_run(ui):
    page = ui.page
    await page.goto(ui.url + "/shards")
    await expect(page.locator("#shards .holder")).to_have_count(4)
    await expect(page.locator("#shards .holder").first).to_contain_text("worker")
    await page.goto(ui.url + "/invocations")
    await expect(page.locator("#invocations")).to_contain_text("No endpoints")
    await page.goto(ui.url + "/schedules")
    await expect(page.locator("#runs .empty")).to_be_visible()
    response = await page.goto(ui.url + "/runs/nobody")
    assert response is not None and response.status == 404
    await expect(page.locator("#error")).to_contain_text("NotFound")
    assert not ui.errors


async def test_a_runs_streams_show_on_its_page(ui):
    await start(ui, "streamer", "st/1", 12)
    assert (await ended(ui, "st/1"))["done"]
    page = ui.page
    await page.goto(f"{ui.url}/runs/{path_id('st/1')}")
    heading = page.locator("section.stream h3")
    await expect(heading).to_have_text("numbers · 12 chunks · complete (ok)")
    text = await page.inner_text("pre.stream[data-stream='numbers']")
    assert text.split() == [str(i) for i in range(12)]
    assert not ui.errors
