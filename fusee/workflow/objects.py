"""Object types (keyed state): what `fusee.object` defines and what a handler touches.

An object type is a set of named handlers; each key of the type is one object with its
own state, and a key is a long-lived run of the type's built-in workflow (its engine side
is `fusee/engine/objects/`). Here are only the plain values a module defines apart from
any engine (`fusee.object`, `fusee.shared`), the state a handler reads and writes (`State`), and
`ctx.object(type, key)`'s calls from workflow code (docs/objects.md). A handler's `ctx`
(`ObjectCtx`: the workflow context plus `state`, `object_key`) is in ctx.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fusee import _codec as codec
from fusee import _names as names
from fusee._errors import RejectedError

if TYPE_CHECKING:
    from fusee.workflow.driver import Driver
    from fusee.workflow.ops import ChildOp, StepOp

HandlerFn = Callable[..., Any]


class Handler:
    """One handler of an object type: its code, whether it is shared (reads only, runs
    beside other calls) and whether it takes an argument."""

    __slots__ = ("fn", "shared", "takes_arg")

    def __init__(self, fn: HandlerFn, shared: bool) -> None:
        if not callable(fn):
            raise TypeError(f"an object handler is a function, not {type(fn).__name__}")
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not params or len(params) > 2:
            raise TypeError(
                f"object handler '{getattr(fn, '__name__', fn)}' must take (ctx) or (ctx, arg), "
                f"not {len(params)} parameters"
            )
        self.fn = fn
        self.shared = shared
        self.takes_arg = len(params) == 2


class _Shared:
    """What `fusee.shared(fn)` returns: `fn`, marked to run as a shared handler."""

    __slots__ = ("fn",)

    def __init__(self, fn: HandlerFn) -> None:
        self.fn = fn


def shared(fn: HandlerFn) -> Any:
    """Mark an object handler as shared: it reads the committed state and runs at once,
    next to other calls of its key."""
    return _Shared(fn)


class ObjectType:
    """A keyed object type: `fusee.object("cart", {"add": add, "get": fusee.shared(get)})`,
    or `cart = fusee.object("cart")` with `@cart.exclusive` and `@cart.shared`."""

    def __init__(self, name: str, handlers: dict[str, Any] | None = None) -> None:
        self.name = names.name(name, "object type name")
        if "/" in name:
            raise RejectedError(
                f"object type name {name!r}: a type name holds no '/' (a key's ID is TYPE/KEY)"
            )
        self.handlers: dict[str, Handler] = {}
        self._workflow: Any = None  # built once, by the first engine that registers it
        for handler_name, fn in (handlers or {}).items():
            if isinstance(fn, _Shared):
                self._add(handler_name, Handler(fn.fn, shared=True))
            else:
                self._add(handler_name, Handler(fn, shared=False))

    def __repr__(self) -> str:
        return f"<fusee.object {self.name!r} handlers={sorted(self.handlers)}>"

    def exclusive(self, fn: HandlerFn) -> HandlerFn:
        """Add `fn` as an exclusive handler, named after the function: one call at a time
        per key, in arrival order; it may change the state."""
        self._add(fn.__name__, Handler(fn, shared=False))
        return fn

    def shared(self, fn: HandlerFn) -> HandlerFn:
        """Add `fn` as a shared handler, named after the function."""
        self._add(fn.__name__, Handler(fn, shared=True))
        return fn

    def _add(self, name: str, handler: Handler) -> None:
        names.name(name, "object handler name")
        if name.startswith("fusee."):
            raise RejectedError(f"object handler name {name!r}: names under 'fusee.' are the engine's")
        if name in self.handlers:
            raise RejectedError(f"object type '{self.name}' has two handlers named '{name}'")
        self.handlers[name] = handler


def object(name: str, handlers: dict[str, Any] | None = None) -> ObjectType:
    """Define an object type (register it with `Engine.open(objects=[...])` or
    `engine.register(...)`)."""
    return ObjectType(name, handlers)


class State:
    """A key's state as one handler sees it: JSON values under string keys. Reads are not
    journaled: replay is exact because commits happen when exclusive handlers return, at
    places the journal fixes. Values are held encoded, so what `get` returns is the
    handler's own copy (changing it changes nothing until `set`)."""

    __slots__ = ("_box", "_fields", "_writable")

    def __init__(self, box: list[dict[str, bytes]], fields: dict[str, bytes] | None) -> None:
        # A shared handler reads the committed state, whatever commits meanwhile (`box` is
        # the key's one holder of it); an exclusive one its own working copy.
        self._box = box
        self._fields = fields
        self._writable = fields is not None

    @property
    def _view(self) -> dict[str, bytes]:
        return self._fields if self._fields is not None else self._box[0]

    def get(self, key: str, default: Any = None) -> Any:
        data = self._view.get(key)
        return default if data is None else codec.decode(data, Any, f"state field '{key}'")

    def set(self, key: str, value: Any) -> None:
        """Set a field (None clears it); seen by this handler at once, by everyone else
        once it returns."""
        fields = self._writing(key)
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = codec.encode(value, f"state field '{key}'")

    def clear(self, key: str) -> None:
        self._writing(key).pop(key, None)

    def clear_all(self) -> None:
        self._writing(None).clear()

    def keys(self) -> list[str]:
        return list(self._view)

    def __contains__(self, key: Any) -> bool:
        return key in self._view

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._view))

    def _writing(self, key: str | None) -> dict[str, bytes]:
        if self._fields is None:
            raise RejectedError("a shared handler reads the state and cannot change it")
        if key is not None and (type(key) is not str or not key):
            raise RejectedError(f"a state field is named by a non-empty string, not {key!r}")
        return self._fields


class ObjectCalls:
    """`ctx.object(type, key)`: calls to a key from workflow code, each a journal
    operation that runs exactly once. `call` is a step whose function sends the call with
    an ID made from the step's key (stable across retries and recovery), so the key runs
    it once and every attempt gets its recorded result; `send` starts a child of the
    built-in `fusee.object.send` workflow (abandoned), so the durable outbox delivers it
    even if the caller ends at once."""

    __slots__ = ("_ctx", "key", "type")

    def __init__(self, ctx: Any, type_name: str, key: str) -> None:
        self._ctx = ctx
        self.type = names.name(type_name, "object type name")
        self.key = names.name(key, "object key")

    def call(self, handler: str, arg: Any = None) -> StepOp:
        """The handler's result (an operation: await it)."""
        run: Driver = self._ctx._run
        target, key = self.type, self.key
        data = codec.encode(arg, f"object call '{handler}' argument")

        async def send_call(s: Any) -> Any:
            return await run.objects().call_from_code(target, key, handler, data, s.key)

        op: StepOp = self._ctx.step(f"{target}.{handler}", send_call)
        return op

    def send(self, handler: str, arg: Any = None) -> ChildOp:
        """Deliver the call without waiting for its result: returns at once (awaiting it
        waits until the delivery is under way)."""
        ctx = self._ctx
        wid = f"fusee.object.send/{ctx.workflow_id}/{ctx.run_number}/{ctx.journal_size()}"
        value = {"type": self.type, "key": self.key, "handler": handler, "arg": arg}
        op: ChildOp = ctx.start_child(SEND_WORKFLOW, wid, value, parent_close="abandon")
        return op


SEND_WORKFLOW = "fusee.object.send"
