"""Storage: the contract every backend keeps, and the memory backend. Local mode lives in
`fusee_server.store`; the remote backend (server mode) joins here."""

from fusee.storage.contract import PAGE_BYTES, Durability, Receive, Report, ShardStore, Storage
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
