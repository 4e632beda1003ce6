"""The scale-to-zero demo: workflows whose code runs only while there is work.

One command starts, in a fresh temporary directory,

- `fusee server`, which holds the shards' logs and POSTs an invocation to an endpoint
  whenever a shard has work and no worker holds it;
- the endpoint: uvicorn serving `handlers.asgi:app`, the stand-in for AWS Lambda or Cloud
  Run. Each request opens an engine for the shards it carries, runs their workflows
  (examples/scale_to_zero_flows.py) until nothing is left to do, reports when the shard is
  next due, and ends;
- a client that starts 40 workflows: orders that ship at once, orders that hold for a few
  seconds (a durable timer) and a refund that waits for a signal.

It prints what happened, then checks two things from the server's own log: while the held
orders slept no worker held any shard, and the timers invoked them again on time. It exits
non-zero if either does not hold. Run it with `python examples/scale_to_zero.py` (or
`scripts/quickstart`, which sets up .venv first); `--keep` keeps the temporary directory
with both processes' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fusee

ROOT = Path(__file__).resolve().parents[1]
FLOWS = "examples.scale_to_zero_flows"  # the handler imports it; this process does not
ITEMS = ["tea", "coffee", "mug", "kettle"]
# The children import `handlers` and the workflows from this checkout.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
LATE_MAX_S = 1.0  # a sleeper invoked or shipped later than this after its timer: failed
# How early the server may invoke for a timer: a parked run's due time is kept rounded down
# to its 100 ms bucket, a shard whose next timer is nearer than 250 ms is not idle, and the
# woken run waits out the rest of its timer itself.
EARLY_OK_S = 0.35

SEND = re.compile(r"fusee invoke: send invocation=(\w+) .*?shards=\[([\d, ]*)\] reasons=(\S+)")
DONE = re.compile(r"fusee invoke: done invocation=(\w+) outcome=(\S+) .*?steps=(\d+)")
LEASE = re.compile(r"shard (\d+): (leased to|released by|let go)")
RECEIVED = re.compile(r"fusee invoke (\w+) \S+ received")


class DemoError(Exception):
    """A process that misbehaved or a result that is wrong: the message says which."""


class Child:
    """A child process in a session of its own (so Ctrl-C reaches only the demo, which
    stops it with SIGTERM), its output kept line by line with the time each line came."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for _, line in list(self.lines)):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise DemoError(f"{self.name} did not print {text!r}; its output:\n{self.tail()}")
            time.sleep(0.02)

    def tail(self, count: int = 30) -> str:
        return "\n".join(f"    {line}" for _, line in self.lines[-count:])

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.reader.join(5)


@dataclass
class Invocation:
    """One POST from the server to the handler, from the server's trace lines."""

    id: str
    sent_at: float
    shards: list[int]
    reasons: str
    done_at: float | None = None
    outcome: str = ""
    steps: int = 0


@dataclass
class Story:
    """What the client did and saw, with when (Unix time)."""

    began: float
    quiet_at: float = 0.0  # all but the sleeping and waiting runs done, nothing held
    polls: int = 0  # metrics polls while the orders slept
    invoking_max: int = 0  # the most invocations in flight one of those polls saw
    held: list[dict[str, Any]] = field(default_factory=list)  # the sleepers' results
    shipped: int = 0
    refund: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def at(self, moment: float) -> float:
        """Seconds since the demo began."""
        return moment - self.began

    def say(self, text: str) -> None:
        print(f"{self.at(time.time()):5.1f}s  {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_processes(tmp: Path, children: list[Child], args: argparse.Namespace, story: Story) -> str:
    """The handler first (the server invokes every shard as it starts), then the server."""
    port, handler_port = free_port(), free_port()
    secret = tmp / "invoke-secret"
    secret.write_text(secrets.token_hex(24))
    secret.chmod(0o600)
    trace = {"FUSEE_INVOKE_TRACE": "1"}
    uvicorn = ["-m", "uvicorn", "handlers.asgi:app", "--host", "127.0.0.1", "--port", str(handler_port)]
    handler_env = {
        "FUSEE_URL": f"127.0.0.1:{port}",
        "FUSEE_INVOKE_SECRET_FILE": str(secret),
        "FUSEE_WORKFLOWS": FLOWS,
    }
    handler = Child("the handler", [sys.executable, *uvicorn], {**trace, **handler_env})
    children.append(handler)
    handler.wait_for("Uvicorn running on")
    story.say(
        f"handler: uvicorn handlers.asgi:app on 127.0.0.1:{handler_port} (stands in for Lambda or Cloud Run)"
    )
    url = f"http://127.0.0.1:{handler_port}/"
    server_args = ["--dir", str(tmp / "data"), "--listen", f"127.0.0.1:{port}", "--shards", "4"]
    server_args += ["--invoke", url, "--invoke-secret-file", str(secret)]
    # The checks read the lease lines, DEBUG for invoked workers (docs/server.md).
    server_args += ["--log-level", "debug"]
    if args.invoke_concurrency:
        server_args += ["--invoke-concurrency", str(args.invoke_concurrency)]
    server = Child("fusee server", [sys.executable, "-m", "fusee", "server", *server_args], trace)
    children.append(server)
    server.wait_for("ready")
    story.say(f"server: fusee server on 127.0.0.1:{port}, 4 shards, invokes {url} when a shard has work")
    return f"127.0.0.1:{port}"


def leases_held(server: Child, at: float) -> set[int]:
    """The shards some worker held at `at`, from the server's lease log lines."""
    held: set[int] = set()
    for seen, line in list(server.lines):
        if seen > at:
            break
        if found := LEASE.search(line):
            if found.group(2) == "leased to":
                held.add(int(found.group(1)))
            else:
                held.discard(int(found.group(1)))
    return held


async def metrics(client: fusee.Client) -> dict[str, Any]:
    """The server's invocation metrics (what `fusee invocations ADDRESS` prints)."""
    answer: dict[str, Any] = await client.call("invocations", {})
    return answer


async def quiet(client: fusee.Client, server: Child, timeout_s: float = 15.0) -> float:
    """Waits until no invocation is in flight and no shard is leased, twice in a row 100 ms
    apart (a shard may be due again between two invocations); returns since when."""
    deadline = time.monotonic() + timeout_s
    calm_since: float | None = None
    streak = 0
    while streak < 2:
        if time.monotonic() > deadline:
            raise DemoError(f"the server never went quiet; its output:\n{server.tail()}")
        now = await metrics(client)
        seen = time.time()
        calm = now["invokingShards"] == 0 and now["endpoints"][0]["inFlight"] == 0
        if calm and not leases_held(server, seen):
            calm_since, streak = calm_since or seen, streak + 1
        else:
            calm_since, streak = None, 0
        await asyncio.sleep(0.1)
    assert calm_since is not None
    return calm_since


async def run_workflows(address: str, server: Child, hold_s: float, story: Story) -> None:
    """The client's part. It never imports the workflow code: it names the type and sends
    JSON. It reads no held order's result while they sleep: a call for a run on a shard
    nobody holds would invoke the handler for it."""
    client = await fusee.Client.connect(address)
    try:
        await quiet(client, server)  # the invocation of every shard a starting server sends
        orders = {
            f"order-{i:02d}": {
                "item": ITEMS[i % 4],
                "quantity": 1 + i % 3,
                "hold_s": hold_s if i % 4 == 0 else 0,
            }
            for i in range(1, 40)
        }
        quick = [wid for wid, order in orders.items() if not order["hold_s"]]
        held = [wid for wid, order in orders.items() if order["hold_s"]]
        await asyncio.gather(*(client.start("order", wid, order) for wid, order in orders.items()))
        refund = await client.start("refund", "refund-01", {"item": "kettle", "quantity": 2})
        story.say(
            f"client: started 40 workflows: {len(quick)} orders that ship at once, {len(held)} that "
            f"hold {hold_s:g} s before shipping, 1 refund that waits for approval"
        )
        shipped = await asyncio.gather(*(client.run(wid).result() for wid in quick))
        story.say(f"client: {len(shipped)} orders shipped")
        story.quiet_at = await quiet(client, server)
        story.say(
            f"server: all quiet: no invocation in flight, no shard leased; {len(held) + 1} runs wait "
            f"({len(held)} on a timer, 1 for a signal)"
        )
        await watch_the_sleep(client, hold_s, story)
        story.say("server: the timers are due: it invokes the handler again")
        story.held = await asyncio.gather(*(client.run(wid).result() for wid in held))
        story.shipped = len(shipped) + len(story.held)
        story.say(f"client: {len(story.held)} held orders shipped; it sends the refund's approval (a signal)")
        await refund.signal("approve", True)
        story.refund = await refund.result()
        story.say(f"client: refund-01: {story.refund}")
        await quiet(client, server)
        story.metrics = await metrics(client)
    finally:
        await client.close()


async def watch_the_sleep(client: fusee.Client, hold_s: float, story: Story) -> None:
    """Polls the server's invocation metrics every 100 ms until it invokes the handler
    again (for the timers), noting the most invocations in flight a poll saw before."""
    sent = (await metrics(client))["endpoints"][0]["invocations"]
    deadline = time.monotonic() + hold_s + 10
    while time.monotonic() < deadline:
        now = await metrics(client)
        if now["endpoints"][0]["invocations"] > sent:
            return
        story.polls += 1
        story.invoking_max = max(story.invoking_max, now["invokingShards"], now["endpoints"][0]["inFlight"])
        await asyncio.sleep(0.1)
    raise DemoError(f"nothing was invoked for {hold_s + 10:g} s: the held orders never woke")


def invocations(server: Child) -> list[Invocation]:
    found: dict[str, Invocation] = {}
    for seen, line in list(server.lines):
        if sent := SEND.search(line):
            shards = [int(s) for s in sent.group(2).split(",") if s.strip()]
            found[sent.group(1)] = Invocation(sent.group(1), seen, shards, sent.group(3))
        elif (done := DONE.search(line)) and done.group(1) in found:
            invocation = found[done.group(1)]
            invocation.done_at, invocation.outcome, invocation.steps = seen, done.group(2), int(done.group(3))
    return list(found.values())


def busy_s(sent: list[Invocation]) -> float:
    """How long at least one invocation was in flight (the union of their spans)."""
    total, end = 0.0, 0.0
    for invocation in sorted(sent, key=lambda i: i.sent_at):
        done = invocation.done_at or invocation.sent_at
        start = max(invocation.sent_at, end)
        if done > start:
            total, end = total + done - start, done
    return total


def report(story: Story, server: Child, handler: Child, finished_at: float) -> list[str]:
    """Prints the invocations, the figures and the two checks; returns what failed."""
    sent = invocations(server)
    per = sorted({len(i.shards) for i in sent})
    each = f"{' or '.join(map(str, per))} shard{'' if per == [1] else 's'} each"
    print(f"\ninvocations: {len(sent)} POSTs to the handler, {each}")
    print("      sent  reasons       shards    steps  answered in")
    for i in sent:
        took = f"{(i.done_at - i.sent_at) * 1000:.0f} ms" if i.done_at else "(no answer)"
        outcome = "" if i.outcome == "succeeded" else f" {i.outcome}"
        shards = ",".join(map(str, i.shards))
        print(f"    {story.at(i.sent_at):5.2f}s  {i.reasons:12}  {shards:8}  {i.steps:5}  {took}{outcome}")
    endpoint = story.metrics["endpoints"][0]
    print(f"steps run: {sum(i.steps for i in sent)} (the server counted {endpoint['steps']})")
    finished = story.shipped + story.refund.startswith("refunded")
    print(f"runs finished: {finished} of 40 ({story.shipped} orders shipped, refund-01 {story.refund})")
    print(f"invocations failed: {endpoint['failed']}, timed out: {endpoint['timedOut']}")
    busy = busy_s(sent)
    print(
        f"total time: {story.at(finished_at):.1f} s; a handler was answering an invocation for {busy:.1f} s of it"
    )
    failed = [] if finished == 40 else [f"{40 - finished} runs did not finish as they should"]
    if endpoint["failed"] or endpoint["timedOut"]:
        failed.append("an invocation failed")
    woke = min((i for i in sent if i.sent_at > story.quiet_at), key=lambda i: i.sent_at)
    due = min(result["due_at"] for result in story.held)  # the earliest timer
    later = {i.id for i in sent if i.sent_at >= woke.sent_at}
    return failed + check_sleep(story, woke, due, later, server, handler) + check_on_time(story, woke, due)


def check_sleep(
    story: Story, woke: Invocation, due: float, later: set[str], server: Child, handler: Child
) -> list[str]:
    """From the moment all else was done until the server next invoked the handler: no shard
    held, no lease granted, no request at the handler, no invocation in flight; and that
    next invocation was for the timers, once they were (nearly) due.

    The server's lines are in the order it wrote them, so their arrival times order them.
    The handler's come through another pipe and may arrive before the server's line that
    sent them: a request is told apart by its invocation ID (`later`: those sent since)."""
    start, end = story.quiet_at, woke.sent_at
    held_then = leases_held(server, start)
    leases = [line for seen, line in server.lines if start < seen < end and "leased to" in line]
    received = [
        line
        for seen, line in handler.lines
        if start < seen < end and (found := RECEIVED.search(line)) and found.group(1) not in later
    ]
    problems = []
    if held_then or leases or received or story.invoking_max:
        problems.append(
            f"shards held at first {sorted(held_then)}, then leases {leases}, requests {received}"
        )
    if woke.reasons != "timer" or end < due - EARLY_OK_S:
        problems.append(f"the next invocation ({woke.reasons}) came {end - due:+.3f} s from the timers")
    span = f"{end - start:.1f} s, from {story.at(start):.1f} s to {story.at(end):.1f} s"
    print(
        f"\ncheck: while the orders slept ({span}) no worker held a shard: the server's log has no "
        f"lease, the handler got no request, {story.polls} polls saw 0 invocations in flight: "
        + ("OK" if not problems else "FAILED: " + "; ".join(problems))
    )
    return problems


def check_on_time(story: Story, woke: Invocation, due: float) -> list[str]:
    """The server invoked the handler for the timers at most EARLY_OK_S early and at most
    LATE_MAX_S late, and each held order shipped after its timer, at most LATE_MAX_S late."""
    invoked_s = woke.sent_at - due
    late_s = sorted(result["shipped_at"] - result["due_at"] for result in story.held)
    ok = -EARLY_OK_S <= invoked_s < LATE_MAX_S and 0 <= late_s[0] and late_s[-1] < LATE_MAX_S
    when = f"{invoked_s * 1000:.0f} ms after" if invoked_s >= 0 else f"{-invoked_s * 1000:.0f} ms before"
    print(
        f"check: the sleepers were invoked again on time: the server sent the invocation {when} their "
        f"timers were due, and they shipped {late_s[0] * 1000:.0f} to {late_s[-1] * 1000:.0f} ms after: "
        + ("OK" if ok else "FAILED")
    )
    return [] if ok else [f"not on time: invoked {invoked_s:+.3f} s, shipped up to {late_s[-1]:+.3f} s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--hold-s", type=float, default=3.0, help="how long held orders sleep (default 3)")
    parser.add_argument(
        "--invoke-concurrency", type=int, help="the server's invocations at once (default 16)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and both logs")
    args = parser.parse_args()
    if not args.hold_s > 0:
        parser.error("--hold-s: the held orders must sleep (above 0)")
    story = Story(time.time())
    tmp = Path(tempfile.mkdtemp(prefix="fusee-demo-"))
    children: list[Child] = []  # the handler, then the server
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM cleans up too
    print(f"fusee scale-to-zero demo, in {tmp}")
    try:
        address = start_processes(tmp, children, args, story)
        workflows = run_workflows(address, children[1], args.hold_s, story)
        asyncio.run(asyncio.wait_for(workflows, args.hold_s + 60))
        finished_at = time.time()
        story.say("stopping the server and the handler (SIGTERM)")
        for child in reversed(children):
            child.stop()
        return 1 if report(story, children[1], children[0], finished_at) else 0
    except (DemoError, TimeoutError) as error:
        print(f"FAILED: {error or 'the workflows took over a minute more than their sleep'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the server and the handler", file=sys.stderr)
        return 130
    finally:
        for child in reversed(children):
            child.stop()
        if args.keep:
            for child, name in zip(children, ["handler.log", "server.log"], strict=False):
                (tmp / name).write_text("".join(line + "\n" for _, line in child.lines))
            print(f"kept {tmp} (data/, handler.log, server.log)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
