"""Payload encryption: `fusee.aes_gcm(keys)` and where payloads are sealed.

A payload is the bytes the codec makes of a value (JSON, or `\\x00` and raw bytes). A
sealed payload is `\\x01`, the key ID's length (one byte), the key ID, a 12-byte nonce,
then AES-256-GCM's ciphertext and tag, the key ID as associated data. JSON never starts
with `\\x01`, so a sealed payload is told apart from a plain one by its first byte, and
sealing is never applied twice.

In memory a run's records hold plain payloads; they are sealed where bytes leave the
process or reach storage: log entries, run-store frames, checkpoints' outboxes, messages
relayed to another worker, and call answers through a server (as `{"$encoded": sealed}`).
They are opened where bytes come back. Headers (IDs, names, positions), error messages
and timestamps stay readable: a server, `fusee inspect` and the UI can still show a run's
shape (docs/engine.md, *Payload encryption*).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from fusee import journal as R
from fusee._errors import CodecError, Failure, RejectedError

SEALED = b"\x01"
NONCE_BYTES = 12
KEY_BYTES = 32
ENCODED = "$encoded"  # how a sealed payload travels in a call's answer, and shows in JSON
_KEY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class AesGcm:
    """AES-256-GCM with named keys: the first encrypts, every one decrypts (a payload
    names its key), so keys rotate by putting a new one first."""

    __slots__ = ("_aead", "_ids", "first")

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise RejectedError(
                "aes_gcm needs the cryptography package: pip install 'fusee[encryption]'"
            ) from None
        self._aead = {kid.encode(): AESGCM(key) for kid, key in keys.items()}
        self._ids = list(keys)
        self.first = next(iter(self._aead))

    @property
    def key_ids(self) -> list[str]:
        return list(self._ids)

    def seal(self, data: bytes) -> bytes:
        if data[:1] == SEALED:
            return data
        nonce = os.urandom(NONCE_BYTES)
        kid = self.first
        return b"".join((SEALED, bytes((len(kid),)), kid, nonce, self._aead[kid].encrypt(nonce, data, kid)))

    def open(self, data: bytes) -> bytes:
        if data[:1] != SEALED:
            return data  # a plain payload (written before the codec, or sent plain)
        size = data[1] if len(data) > 1 else 0
        kid = data[2 : 2 + size]
        nonce = data[2 + size : 2 + size + NONCE_BYTES]
        aead = self._aead.get(kid)
        if aead is None:
            raise CodecError(
                f"a payload sealed with key {kid.decode(errors='replace')!r}, which this codec does "
                f"not hold (it holds {', '.join(self._ids)}): keep old keys after the new one"
            )
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(aead.decrypt(nonce, data[2 + size + NONCE_BYTES :], kid))
        except (InvalidTag, ValueError):
            raise CodecError(
                f"a payload sealed with key {kid.decode(errors='replace')!r} does not decrypt: it is "
                "damaged, or that key ID names another key here"
            ) from None


def aes_gcm(keys: Mapping[str, bytes | str]) -> AesGcm:
    """The codec for `Engine.open(codec=...)` and `Client.connect(..., codec=...)`: key
    IDs to 32-byte keys (bytes, or 64 hex digits), the first used to encrypt."""
    if not isinstance(keys, Mapping) or not keys:
        raise RejectedError("aes_gcm(keys): give at least one key, {'k1': 32 bytes}")
    checked: dict[str, bytes] = {}
    for kid, key in keys.items():
        if not isinstance(kid, str) or not _KEY_ID.match(kid):
            raise RejectedError(f"aes_gcm: key ID {kid!r}: 1 to 64 letters, digits or ._:-")
        if isinstance(key, str):
            try:
                key = bytes.fromhex(key)
            except ValueError:
                raise RejectedError(f"aes_gcm: key {kid!r} is not hex") from None
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            raise RejectedError(f"aes_gcm: key {kid!r} must be {KEY_BYTES} bytes (64 hex digits) for AES-256")
        checked[kid] = bytes(key)
    return AesGcm(checked)


def keys_file(text: str, name: str) -> dict[str, str]:
    """`<key ID> <64 hex digits>` per line (`#` comments), as `fusee codec-server
    --keys-file` reads them; the first line's key encrypts."""
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise RejectedError(f"{name} line {number}: expected '<key ID> <64 hex digits>'")
        keys[parts[0]] = parts[1]
    if not keys:
        raise RejectedError(f"{name}: no keys in it")
    return keys


# -- records and messages -----------------------------------------------------------------

_NOT_PAYLOADS = {R.Drawn}  # now, random, uuid: the engine's values, not the application's


def payload_fields(cls: type) -> tuple[str, ...]:
    """The payload fields encryption seals: every one but the engine's own values'."""
    return () if cls in _NOT_PAYLOADS else R.payload_fields(cls)


def _mapped(rec: Any, codec: AesGcm, sealing: bool) -> Any:
    fn = codec.seal if sealing else codec.open
    changes: dict[str, Any] = {}
    for name in payload_fields(type(rec)):
        value = getattr(rec, name)
        if value:
            changes[name] = fn(value)
    failure = getattr(rec, "failure", None)
    if failure is not None:
        mapped = _failure(failure, codec, sealing)
        if mapped is not failure:
            changes["failure"] = mapped
    return msgspec.structs.replace(rec, **changes) if changes else rec


def _failure(failure: Failure, codec: AesGcm, sealing: bool) -> Failure:
    """A failure's `details` are the application's data: sealed as a payload (kept as
    `{"$encoded": sealed}`), down its causes. Its message, type and stack stay readable."""
    from fusee import _codec

    cause = _failure(failure.cause, codec, sealing) if failure.cause is not None else None
    details = failure.details
    if details is not None:
        if sealing and not is_encoded(details):
            details = {ENCODED: codec.seal(_codec.encode(details, "a failure's details"))}
        elif not sealing and is_encoded(details):
            details = _codec.decode(codec.open(details[ENCODED]))
    if details is failure.details and cause is failure.cause:
        return failure
    return msgspec.structs.replace(failure, details=details, cause=cause)


def sealed_payloads(rec: Any) -> bytes | None:
    """A payload of `rec` that is sealed, if any: what an engine without a codec refuses
    to replay (it would take the ciphertext for a value the code did not make)."""
    for name in payload_fields(type(rec)):
        value = getattr(rec, name)
        if value and value[:1] == SEALED:
            return bytes(value)
    return None


def seal_rec(codec: AesGcm, rec: R.Rec) -> R.Rec:
    out: R.Rec = _mapped(rec, codec, True)
    return out


def open_rec(codec: AesGcm, rec: R.Rec) -> R.Rec:
    out: R.Rec = _mapped(rec, codec, False)
    return out


def seal_msg(codec: AesGcm, msg: R.Msg) -> R.Msg:
    out: R.Msg = _mapped(msg, codec, True)
    return out


def open_msg(codec: AesGcm, msg: R.Msg) -> R.Msg:
    out: R.Msg = _mapped(msg, codec, False)
    return out


def sealed_frame(codec: AesGcm | None, wid: str, run_no: int, records: list[R.Rec]) -> bytes:
    """A run-store frame, its payloads sealed (plain without a codec)."""
    if codec is not None:
        records = [seal_rec(codec, rec) for rec in records]
    return R.encode_frame(R.Frame(wid, run_no, records))


def opened_frame(codec: AesGcm | None, data: bytes) -> R.Frame:
    """A run-store frame with its payloads opened. Without a codec, a frame holding a
    sealed payload is a CodecError saying so, not a run replayed on ciphertext (it would
    go stuck, and a reset or terminate, as that says to do, would lose it)."""
    frame = R.decode_frame(data)
    if codec is not None:
        try:
            frame.records = [open_rec(codec, rec) for rec in frame.records]
        except CodecError as error:
            raise CodecError(f"run '{frame.wid}': {error.message}") from None
    else:
        for rec in frame.records:
            refuse_sealed(rec, frame.wid)
    return frame


def refuse_sealed(rec: Any, wid: str) -> None:
    sealed = sealed_payloads(rec)
    if sealed is not None:
        size = sealed[1] if len(sealed) > 1 else 0
        kid = sealed[2 : 2 + size].decode(errors="replace")
        raise CodecError(
            f"run '{wid}' holds payloads encrypted with key {kid!r}: open the engine with "
            "codec=fusee.aes_gcm(keys) (FUSEE_CODEC_KEYS_FILE for the handlers)"
        )


# -- calls through a server -----------------------------------------------------------------


def wire_out(codec: AesGcm | None, data: bytes) -> Any:
    """A payload leaving in a call's answer or arguments: sealed as `{"$encoded": ...}`
    with a codec; the plain value without one."""
    if codec is None:
        from fusee import _codec

        return _codec.decode(data)
    return {ENCODED: codec.seal(data)}


def is_encoded(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and type(value.get(ENCODED)) is bytes


def wire_in(codec: AesGcm | None, value: Any) -> Any:
    """A value from a call: opened when it is sealed (`{"$encoded": ...}`) and the codec
    holds its key; as it came otherwise (a plain value, or sealed with no codec here)."""
    if codec is None or not is_encoded(value):
        return value
    from fusee import _codec

    return _codec.decode(codec.open(value[ENCODED]))
