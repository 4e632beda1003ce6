"""`fusee server --backup` to S3, every part a real process on loopback: moto's server as
S3, the log server, a worker, a client under load. The server is SIGKILLed; the backup
restored on a fresh directory holds every start acknowledged long enough before the kill,
with its steps' results, and a point from the middle of the run holds exactly the runs
acknowledged by then. A target that stops answering slows no step, and the backup
catches up once it answers again."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from signal import SIGKILL

import pytest

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.handlers import AWS
from tests.support.procs import Proc, free_port

BUCKET = "fusee-backups"
INTERVAL_S = 1.0  # the default upload_interval
# What a kill may lose: about one interval plus one upload (docs/backup.md).
MAY_LOSE_S = INTERVAL_S + 1.5


class MotoS3(Proc):
    def __init__(self, port: int) -> None:
        super().__init__([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], AWS)
        self.url = f"http://127.0.0.1:{port}"
        self.wait_for(r"Running on")
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", **_keys()).create_bucket(
            Bucket=BUCKET
        )


def _keys() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS["AWS_SECRET_ACCESS_KEY"],
    }


@pytest.fixture
def s3(procs: list[Proc], monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)  # the server and the CLI inherit them
    moto = MotoS3(free_port())
    procs.append(moto)
    yield moto


def url(s3: MotoS3 | str, prefix: str = "orders") -> str:
    endpoint = s3 if isinstance(s3, str) else s3.url
    return f"s3://{BUCKET}/{prefix}?endpoint={endpoint}&region=us-east-1"


class Outage:
    """A TCP relay in front of S3 that can go away: while down, its port refuses
    connections and the ones open are cut, as a target that became unreachable."""

    def __init__(self, upstream: str) -> None:
        self.host, port = upstream.removeprefix("http://").split(":")
        self.upstream = int(port)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True)

    async def down(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.open):
            writer.transport.abort()
        await self.server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream)
        self.open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()
                self.open.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", *map(str, args)], capture_output=True, text=True, timeout=60
    )


async def load(client: fusee.Client, until: float, acked: dict[str, tuple[float, float]]) -> None:
    """Start runs one after another until `until`: each one's send and acknowledgment time."""
    n = 0
    while time.time() < until:
        wid = f"load-{n}"
        sent = time.time()
        await client.start("steps", wid, 1)
        acked[wid] = (sent, time.time())
        n += 1


async def restored_runs(root: Path) -> dict[str, object]:
    """Every run of a restored directory with its result (None: not finished)."""
    async with await fusee.Engine.open(str(root), workflows=WORKFLOWS) as engine:
        found: dict[str, object] = {}
        async for row in engine.list(type="steps"):
            found[row.id] = await engine.run(row.id).result() if row.status == "ok" else None
        return found


async def test_kill_then_restore_latest_and_a_point_in_the_middle(s3, start_server, start_worker, tmp_path):
    server = start_server("--backup", url(s3))
    worker = start_worker(server.address())
    client = await fusee.Client.connect(server.address())
    acked: dict[str, tuple[float, float]] = {}
    try:
        began = time.time()
        await load(client, began + 6.0, acked)
        results = {wid: await client.run(wid).result() for wid in list(acked)[:20]}
    finally:
        await client.close()
    killed_at = time.time()
    server.kill()
    worker.kill()
    assert len(acked) > 50, len(acked)

    latest = tmp_path / "latest"
    done = cli("restore", url(s3), latest)
    assert done.returncode == 0, done.stderr
    runs = await restored_runs(latest)
    lost = [wid for wid, (_, ack) in acked.items() if ack < killed_at - MAY_LOSE_S and wid not in runs]
    assert not lost, f"{len(lost)} acknowledged starts missing, the first {lost[0]}"
    for wid, result in results.items():
        assert runs[wid] == result, wid  # the steps' results, as the client read them

    # A point from the middle of the run: exactly the runs acknowledged by then (those
    # sent before it and acknowledged after it may be either side).
    listing = cli("backups", url(s3), "--json")
    points = [p["atMs"] for p in json.loads(listing.stdout)["points"]]
    middle = min(points, key=lambda at: abs(at / 1000 - (began + 3.0)))
    back = tmp_path / "middle"
    assert cli("restore", url(s3), back, "--at", str(middle)).returncode == 0
    then = await restored_runs(back)
    for wid, (sent, ack) in acked.items():
        if ack * 1000 < middle:
            assert wid in then, wid
        elif sent * 1000 > middle:
            assert wid not in then, wid


@pytest.mark.parametrize(
    "outage_s", [4.0, pytest.param(30.0, marks=[pytest.mark.slow, pytest.mark.timeout(180)])]
)
async def test_an_unreachable_target_slows_no_step_and_is_caught_up(
    s3, start_server, start_worker, tmp_path, outage_s
):
    http = free_port()
    relay = Outage(s3.url)
    await relay.up()
    server = start_server("--backup", url(relay.url), "--http", f"127.0.0.1:{http}")
    start_worker(server.address())
    client = await fusee.Client.connect(server.address())

    async def timed(seconds: float) -> list[float]:
        took = []
        until = time.time() + seconds
        n = len(acked)
        while time.time() < until:
            began = time.perf_counter()
            await client.start("steps", f"w-{n}", 1)
            took.append(time.perf_counter() - began)
            acked[f"w-{n}"] = (0.0, time.time())
            n += 1
        return took

    def lag() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("fusee_backup_lag_seconds "):
                    return float(line.split()[1])
        raise AssertionError("no fusee_backup_lag_seconds in /metrics")

    acked: dict[str, tuple[float, float]] = {}
    try:
        before = await timed(3.0)
        await relay.down()
        try:
            during = await timed(outage_s)
            assert lag() > outage_s / 2, "the lag must show while the target is away"
            server.wait_for(r"backup to .* is failing")
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/backup", timeout=5) as answer:
                status = json.loads(answer.read())
            assert status["failing"] and status["error"], status
        finally:
            await relay.up()
        deadline = time.time() + 60
        while lag() > 0 and time.time() < deadline:
            await asyncio.sleep(0.5)
        assert lag() == 0, "the backup did not catch up"
        server.wait_for(r"backup to .* caught up")
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/backup", timeout=5) as answer:
            status = json.loads(answer.read())
        assert status["lag_s"] == 0 and not status["failing"] and status["uploads"] > 0, status
    finally:
        await client.close()
    # The write path never waits for the backup: the median start is the same.
    assert statistics.median(during) < statistics.median(before) * 1.5 + 0.005, (
        statistics.median(before),
        statistics.median(during),
    )
    server.signal(SIGKILL)
    restored = tmp_path / "restored"
    assert cli("restore", url(s3), restored).returncode == 0
    await relay.down()
    runs = await restored_runs(restored)
    assert all(wid in runs for wid in acked), "a start acknowledged during the outage is missing"


async def test_a_bad_target_fails_the_start_naming_the_setting(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusee",
            "server",
            "--dir",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
            "--backup",
            "s3://",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "--backup s3://" in done.stderr and "no bucket" in done.stderr
    assert not (tmp_path / "d").exists()  # a refused start records nothing


async def test_verify_names_a_damaged_object(s3, start_server, start_worker, tmp_path):
    server = start_server("--backup", url(s3, "verify"))
    start_worker(server.address())
    client = await fusee.Client.connect(server.address())
    try:
        for n in range(5):
            await (await client.start("steps", f"v-{n}", 1)).result()
    finally:
        await client.close()
    assert server.stop() == 0  # a clean stop makes the last upload
    assert cli("backups", url(s3, "verify"), "--verify").returncode == 0
    import boto3

    bucket = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1", **_keys())
    keys = [o["Key"] for o in bucket.list_objects_v2(Bucket=BUCKET, Prefix="verify/")["Contents"]]
    victim = next(k for k in keys if k.endswith(".rec"))
    body = bytearray(bucket.get_object(Bucket=BUCKET, Key=victim)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    bucket.put_object(Bucket=BUCKET, Key=victim, Body=bytes(body))
    done = cli("backups", url(s3, "verify"), "--verify")
    assert done.returncode == 1
    assert victim.removeprefix("verify/") in done.stdout and "damaged" in done.stdout
