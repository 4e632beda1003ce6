"""Edits of a key's state from outside (`set_state`, `patch_state`, `clear_state`,
`edit_state`; docs/objects.md, *Editing state from outside*) and the key's version.

An edit is applied by the built-in exclusive handler `fusee.state.edit`, so it waits for
the key like any exclusive call and commits with its result; this module is only the
pure part: what an edit does to a state, and the version that `if_version` compares.
"""

from __future__ import annotations

from _blake2 import blake2b  # hashlib's own BLAKE2, without loading OpenSSL's (cold path)
from typing import Any

import msgspec

from fusee import _codec as codec
from fusee._errors import RejectedError, StaleVersionError

EDIT_KEYS = frozenset({"clear_all", "clear", "set", "patch", "if_version"})
_sorted = msgspec.json.Encoder(order="sorted").encode


def version_of(fields: dict[str, bytes]) -> str:
    """A hash of the state: the same state has the same version in every process (its
    fields and values encoded with keys in sorted order)."""
    whole = {key: codec.decode(data, Any, f"state field '{key}'") for key, data in fields.items()}
    return blake2b(_sorted(whole), digest_size=8).hexdigest()


def check_edit(edit: Any) -> dict[str, Any]:
    """The edit, refused with what is wrong before anything is sent."""
    if not isinstance(edit, dict):
        raise RejectedError(f"an edit is a dict of {sorted(EDIT_KEYS)}, not {type(edit).__name__}")
    unknown = set(edit) - EDIT_KEYS
    if unknown:
        raise RejectedError(f"an edit has no {sorted(unknown)}: it takes {sorted(EDIT_KEYS)}")
    clear = edit.get("clear", [])
    if not isinstance(clear, list) or not all(type(k) is str for k in clear):
        raise RejectedError("edit 'clear' is a list of field names")
    sets = edit.get("set", {})
    if not isinstance(sets, dict) or not all(type(k) is str and k for k in sets):
        raise RejectedError("edit 'set' is a dict of field names to values")
    patch = edit.get("patch", [])
    if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
        raise RejectedError("edit 'patch' is a JSON Patch: a list of operations (RFC 6902)")
    if_version = edit.get("if_version")
    if if_version is not None and type(if_version) is not str:
        raise RejectedError("edit 'if_version' is a version string (from inspect() or `fusee objects show`)")
    if type(edit.get("clear_all", False)) is not bool:
        raise RejectedError("edit 'clear_all' is true or false")
    return edit


def apply_edit(fields: dict[str, bytes], edit: dict[str, Any]) -> tuple[dict[str, bytes], list[str]]:
    """The state after `edit` (`clear_all`, then `clear`, then `set`, then `patch`) and
    the fields it changed, sorted. Raises `StaleVersionError` if the state is no longer
    at `if_version`, `RejectedError` naming the operation of a patch that does not apply;
    either way nothing changes."""
    current = version_of(fields)
    wanted = edit.get("if_version")
    if wanted is not None and wanted != current:
        raise StaleVersionError(
            f"the state changed since version {wanted} was read (it is at {current} now): read it again",
            version=current,
        )
    out = {} if edit.get("clear_all") else dict(fields)
    for key in edit.get("clear", []):
        out.pop(key, None)
    for key, value in edit.get("set", {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = codec.encode(value, f"state field '{key}'")
    patch = edit.get("patch")
    if patch:
        out = _patched(out, patch)
    changed = sorted(k for k in set(fields) | set(out) if fields.get(k) != out.get(k))
    return out, changed


def _patched(fields: dict[str, bytes], ops: list[dict[str, Any]]) -> dict[str, bytes]:
    import jsonpatch  # only edits with a patch pay for its import
    import jsonpointer

    whole = {key: codec.decode(data, Any, f"state field '{key}'") for key, data in fields.items()}
    for number, op in enumerate(ops):
        try:
            whole = jsonpatch.JsonPatch([op]).apply(whole)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError) as error:
            raise RejectedError(f"patch operation {number} ({op!r}) does not apply: {error}") from None
    if not isinstance(whole, dict):
        raise RejectedError("a patch must leave the state an object of fields")
    return {
        key: codec.encode(value, f"state field '{key}'") for key, value in whole.items() if value is not None
    }
