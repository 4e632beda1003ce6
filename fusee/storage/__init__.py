"""Storage: the contract every backend keeps, and the memory backend. Local mode lives in
`fusee_server.local`; the remote backend (server mode) joins here."""

from fusee.storage.contract import Durability, Recovered, ShardStore, Storage
from fusee.storage.memory import MemoryShardStore, MemoryStorage

__all__ = ["Durability", "MemoryShardStore", "MemoryStorage", "Recovered", "ShardStore", "Storage"]
