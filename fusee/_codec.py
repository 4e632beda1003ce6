"""Payload codec: JSON through msgspec, typed on the way in and out; `bytes` raw.

A payload is the bytes the journal records. JSON never starts with a NUL byte, so a
leading NUL marks a raw `bytes` value; no pickle anywhere.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Any

import msgspec

from fusee._errors import CodecError

RAW = b"\x00"
NULL = b"null"
PAYLOAD_BYTES_MAX = 16 << 20
"""A payload's encoded size at most: a record holds at most a few payloads, and a record must
fit one log batch (64 MiB) to be recoverable, so a bigger value is refused before anything
is recorded rather than acknowledged and lost."""
DEPTH_MAX = 256
"""How deep a payload may nest. Decoding recurses once per level on whatever stack replay
runs on; a bound well under Python's recursion limit makes a value that encoded once
decode the same way everywhere."""
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

_encode_json = msgspec.json.Encoder().encode
_decode_any = msgspec.json.Decoder().decode
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def encode(value: Any, what: str = "value") -> bytes:
    """Encode a payload, naming the path of the first value JSON cannot hold."""
    if type(value) is bytes:
        data = RAW + value
    else:
        try:
            data = _encode_json(value)
        except RecursionError:
            raise CodecError(f"{what} cannot be encoded: it nests deeper than {DEPTH_MAX} levels") from None
        except (TypeError, msgspec.EncodeError, OverflowError, UnicodeEncodeError) as exc:
            try:
                path = _bad_path(value, "$") or "$"
            except RecursionError:
                path = "$"
            raise CodecError(
                f"{what} cannot be encoded: a {type(_at(value, path)).__name__} at {path} ({exc})",
                path=path,
            ) from None
        if len(data) <= 2 * DEPTH_MAX:
            return data  # too short to nest too deep or be too long
        if data.count(b"[") + data.count(b"{") > DEPTH_MAX and _depth(data) > DEPTH_MAX:
            raise CodecError(f"{what} cannot be encoded: it nests deeper than {DEPTH_MAX} levels")
    if len(data) > PAYLOAD_BYTES_MAX:
        raise CodecError(
            f"{what} is {len(data):,} bytes encoded; a value may be at most {PAYLOAD_BYTES_MAX:,} "
            "bytes (16 MiB): keep large data outside the journal and record a reference to it"
        )
    return data


def _depth(data: bytes) -> int:
    """The deepest nesting of encoded JSON (only called when it has enough brackets to be
    too deep): strings are cut out, then brackets counted."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        if byte in (91, 123):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def decode(data: bytes, type_: Any = Any, what: str = "value") -> Any:
    """Decode a payload into `type_` (`Any` gives plain JSON values)."""
    if data[:1] == RAW:
        return data[1:]
    if type_ is Any or type_ is None:
        try:
            return _decode_any(data)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise CodecError(_undecodable(data, what, exc)) from None
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise CodecError(f"{what} does not match {_type_name(type_)}: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CodecError(_undecodable(data, what, exc)) from None


def _undecodable(data: bytes, what: str, exc: Exception) -> str:
    if data[:1] == b"\x01":  # fusee/_sealing.py's mark
        return (
            f"{what} is encrypted: open the engine (or client) with the codec that sealed it "
            "(codec=fusee.aes_gcm(keys))"
        )
    return f"{what} cannot be decoded: {exc}"


def convert(value: Any, type_: Any, what: str = "value") -> tuple[bytes, Any]:
    """Encode `value` and check it against `type_`: the bytes to record and the typed value
    the code will receive (the same as after a replay)."""
    data = encode(value, what)
    return data, decode(data, type_, what)


def _type_name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)


def _bad_path(value: Any, path: str) -> str | None:
    """Slow path, only after an encode failed: walk the value to the unencodable part."""
    try:
        _encode_json(value)
        return None
    except Exception:  # noqa: BLE001 - any encode failure means: look inside
        pass
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _bad_path(item, f"{path}.{key}")
            if found:
                return found
        return path
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            found = _bad_path(item, f"{path}[{index}]")
            if found:
                return found
        return path
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses  # the value's own module loaded it already; kept off fusee's import path

        for field in dataclasses.fields(value):
            found = _bad_path(getattr(value, field.name), f"{path}.{field.name}")
            if found:
                return found
        return path
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            found = _bad_path(getattr(value, name), f"{path}.{name}")
            if found:
                return found
    return path


def _at(value: Any, path: str) -> Any:
    """The value a `_bad_path` result names (for the message)."""
    import re

    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path[1:]):
        key, index = part
        if index:
            value = list(value)[int(index)]
        elif isinstance(value, Mapping):
            value = value[key]
        else:
            value = getattr(value, key)
    return value


_return_types: dict[Any, Any] = {}


def return_type(fn: Any) -> Any:
    """A step function's return annotation (cached per code object), so its recorded
    result decodes to the same type live and after a replay."""
    code = getattr(fn, "__code__", None)
    if (
        code is None
        and isinstance(fn, types.BuiltinFunctionType)
        and isinstance(getattr(fn, "__self__", None), types.ModuleType)
    ):
        code = fn  # a module's builtin (`time.time`): lives as long as the process
    try:
        return _return_types[code]
    except KeyError:
        pass
    import typing

    try:
        hint = typing.get_type_hints(fn).get("return", Any)
    except Exception:  # noqa: BLE001 - unresolvable: plain JSON
        hint = Any
    if hint is None or hint is type(None) or typing.get_origin(hint) in (typing.Awaitable, typing.Coroutine):
        hint = Any
    if code is not None:
        _return_types[code] = hint
    return hint
