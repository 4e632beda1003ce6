"""Payload encryption (docs/engine.md, *Payload encryption*): with `codec=fusee.aes_gcm(keys)`
no payload byte reaches the data directory in plain text (log, run stores, checkpoints),
whatever the run did (a step, heartbeats, a child, a signal, an update), across a crash and
a park; keys rotate by putting a new one first; a key that is missing, or a payload that
was tampered with, is a CodecError naming the key."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import fusee
from fusee._sealing import SEALED
from tests.server_mode.flows import confide, secret, secret_child, whisper
from tests.support.waiting import eventually

K1, K2 = os.urandom(32), os.urandom(32)
MARKER = "zq-secret-7f3a"


def _files(root: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}


def _plain_hits(root: Path, marker: str = MARKER) -> list[str]:
    return [str(path) for path, data in _files(root).items() if marker.encode() in data]


async def _open(data: Path, codec: fusee.AesGcm | None) -> fusee.Engine:
    return await fusee.Engine.open(
        str(data), workflows=[secret, secret_child], codec=codec, park_after="50ms"
    )


async def _run_secret(data: Path, codec: fusee.AesGcm | None, wid: str) -> dict:
    """A `secret` run through every payload kind, with a crash (an abandon) in the middle
    and a park of the waiting run, then its result."""
    engine = await _open(data, codec)
    await engine.start(secret, wid, MARKER)

    async def waiting() -> bool:  # child done, the run waits for the signal
        rows = (await engine.run(wid).describe()).journal
        return any(type(r).__name__ == "WaitStarted" for r in rows)

    await eventually(waiting, timeout=20, every=0.02)
    assert (
        await engine.run(wid).update(confide, MARKER + "-update-arg") == MARKER + "-update-arg-update-result"
    )
    await asyncio.sleep(0.3)  # parked meanwhile: its frame is in the run store
    engine.abandon()
    await engine.storage.abandon()
    engine = await _open(data, codec)  # recovery reads the sealed log and frames back
    await engine.run(wid).signal(whisper, MARKER + "-signal")
    result = await asyncio.wait_for(engine.run(wid).result(), 20)
    await engine.close()  # a checkpoint, with the outbox and index
    return result


async def test_no_payload_reaches_the_directory_in_plain_text(tmp_path: Path):
    expected = {
        "step": MARKER + "-step",
        "child": MARKER + "-child-input-child-step",
        "signal": MARKER + "-signal",
        "updates": [MARKER + "-update-arg"],
    }
    plain = tmp_path / "plain"
    assert await _run_secret(plain, None, "s-1") == expected
    # The control: without a codec the marker is there (so the search below can fail).
    assert _plain_hits(plain)

    sealed = tmp_path / "sealed"
    assert await _run_secret(sealed, fusee.aes_gcm({"k1": K1}), "s-1") == expected
    assert _plain_hits(sealed) == []
    assert any(SEALED + b"\x02k1" in data for data in _files(sealed).values())
    # The headers stay readable: workflow IDs, types and step names are still there.
    everything = b"".join(_files(sealed).values())
    assert b"s-1/child" in everything and b"secret_child" in everything and b"beat" in everything

    # The same engine's own reads are plain: describe opens what storage holds sealed.
    engine = await _open(sealed, fusee.aes_gcm({"k1": K1}))
    journal = (await engine.run("s-1").describe()).journal
    assert any(MARKER.encode() in (getattr(r, "value", None) or b"") for r in journal)
    await engine.close()


async def test_keys_rotate_by_putting_a_new_one_first(tmp_path: Path):
    data = tmp_path / "data"
    await _run_secret(data, fusee.aes_gcm({"k1": K1}), "old")
    # A deploy with a new first key: the old runs still read, new payloads use k2.
    rotated = fusee.aes_gcm({"k2": K2, "k1": K1})
    assert (await _run_secret(data, rotated, "new"))["step"] == MARKER + "-step"
    files = _files(data).values()
    assert any(SEALED + b"\x02k2" in blob for blob in files)
    engine = await _open(data, rotated)
    assert (await engine.run("old").result())["signal"] == MARKER + "-signal"
    await engine.close()
    assert _plain_hits(data) == []

    # Without the old key, a run sealed with it cannot be read: said, naming the key.
    engine = await _open(data, fusee.aes_gcm({"k2": K2}))
    with pytest.raises(fusee.CodecError, match="'k1'"):
        await engine.run("old").describe()
    await engine.close()


def test_a_tampered_or_foreign_payload_is_a_codec_error():
    codec = fusee.aes_gcm({"k1": K1})
    sealed = codec.seal(b'"hello"')
    assert sealed[:1] == SEALED and b"hello" not in sealed
    assert codec.open(sealed) == b'"hello"'
    assert codec.seal(sealed) == sealed  # never sealed twice
    assert codec.open(b'"plain"') == b'"plain"'  # written before the codec: read as it is
    damaged = bytearray(sealed)
    damaged[-1] ^= 1
    with pytest.raises(fusee.CodecError, match="does not decrypt"):
        codec.open(bytes(damaged))
    other = fusee.aes_gcm({"k1": K2})  # the same ID naming another key
    with pytest.raises(fusee.CodecError, match="does not decrypt"):
        other.open(sealed)
    with pytest.raises(fusee.CodecError, match="is encrypted"):
        fusee._codec.decode(sealed)


@pytest.mark.parametrize(
    "keys, message",
    [
        ({}, "at least one key"),
        ({"k1": b"short"}, "32 bytes"),
        ({"k1": "zz" * 32}, "not hex"),
        ({"": K1}, "key ID"),
        ({"a b": K1}, "key ID"),
        ([("k1", K1)], "at least one key"),
    ],
)
def test_bad_keys_are_refused_naming_them(keys, message):
    with pytest.raises(fusee.RejectedError, match=message):
        fusee.aes_gcm(keys)


def test_a_key_may_be_given_as_hex():
    assert fusee.aes_gcm({"k1": K1.hex()}).open(fusee.aes_gcm({"k1": K1}).seal(b"1")) == b"1"


async def test_open_refuses_a_codec_that_is_not_one(tmp_path: Path):
    with pytest.raises(fusee.RejectedError, match="aes_gcm"):
        await fusee.Engine.open(str(tmp_path / "d"), codec="k1")
    assert not (tmp_path / "d").exists()  # refused before anything was created


@fusee.workflow("declined")
async def declined(ctx: fusee.Ctx, card: str) -> str:
    def charge() -> str:
        raise fusee.Fatal("card declined", details={"card": card})

    return str(await ctx.step("charge", charge))


async def test_a_failures_details_are_sealed_and_its_message_stays_readable(tmp_path: Path):
    data = tmp_path / "data"
    codec = fusee.aes_gcm({"k1": K1})
    engine = await fusee.Engine.open(str(data), workflows=[declined], codec=codec)
    await engine.start(declined, "d-1", MARKER + "-card")
    with pytest.raises(fusee.StepError):
        await engine.run("d-1").result()
    await engine.close()
    assert _plain_hits(data) == []
    assert any(b"card declined" in blob for blob in _files(data).values())
    engine = await fusee.Engine.open(str(data), workflows=[declined], codec=codec)
    with pytest.raises(fusee.StepError) as raised:
        await engine.run("d-1").result()
    assert raised.value.cause is not None and raised.value.cause.details == {"card": MARKER + "-card"}
    await engine.close()


async def test_a_run_sealed_with_a_missing_key_stops_only_itself(tmp_path: Path):
    data = tmp_path / "data"
    engine = await _open(data, fusee.aes_gcm({"k1": K1}))
    await engine.start(secret, "p-1", MARKER)
    await eventually(lambda: "p-1" not in engine.shard_of("p-1").runs, timeout=20, every=0.05)
    shard = engine.shard_of("p-1").index
    await engine.close()
    engine = await _open(data, fusee.aes_gcm({"k2": K2}))  # k1 forgotten
    with pytest.raises(fusee.CodecError, match=r"run 'p-1'.*'k1'"):
        await engine.run("p-1").status()
    # The shard goes on: a new run on it starts and runs.
    other = next(f"n-{i}" for i in range(1000) if engine.shard_of(f"n-{i}").index == shard)
    await engine.start(secret_child, other, "fresh")
    assert await asyncio.wait_for(engine.run(other).result(), 10) == "fresh-child-step"
    await engine.close()


async def test_an_engine_without_the_codec_refuses_to_replay_ciphertext(tmp_path: Path):
    data = tmp_path / "data"
    engine = await _open(data, fusee.aes_gcm({"k1": K1}))
    await engine.start(secret, "a-1", MARKER)
    await asyncio.sleep(0.1)
    engine.abandon()  # a crash: the run is recovered from the log at the next open
    await engine.storage.abandon()
    with pytest.raises(fusee.CodecError, match=r"encrypted with key 'k1'.*codec=fusee\.aes_gcm"):
        await _open(data, None)
    engine = await _open(data, fusee.aes_gcm({"k1": K1}))  # nothing was lost by the refusal
    await engine.run("a-1").signal(whisper, "late")
    assert (await asyncio.wait_for(engine.run("a-1").result(), 20))["signal"] == "late"
    await engine.close()
