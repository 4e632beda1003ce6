"""Storage: the contract every backend keeps, and the memory backend. Local mode lives in
`fusee_server.store`; the remote backend (server mode) joins here.

The memory backend loads on first use (module `__getattr__`): an invoked function's
`import fusee` needs only the contract (tests/test_layout.py pins it out)."""

from typing import TYPE_CHECKING, Any

from fusee.storage.contract import PAGE_BYTES, Durability, Receive, Report, ShardStore, Storage

if TYPE_CHECKING:
    from fusee.storage.memory import MemoryLease, MemoryShardStore, MemoryStorage

__all__ = [
    "PAGE_BYTES",
    "Durability",
    "MemoryLease",
    "MemoryShardStore",
    "MemoryStorage",
    "Receive",
    "Report",
    "ShardStore",
    "Storage",
]

_MEMORY = ("MemoryLease", "MemoryShardStore", "MemoryStorage")


def __getattr__(name: str) -> Any:
    if name in _MEMORY:
        from fusee.storage import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
