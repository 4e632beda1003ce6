"""fusee-server: the disk path behind local mode (`Engine.open("./data")`) and, later,
`fusee server`. The Rust extension `fusee_server._native` holds the shared log, the run
stores and the checkpoints; this package adapts it to the engine's storage interface."""

from fusee_server.store import LocalShardStore, LocalStorage

__all__ = ["LocalShardStore", "LocalStorage"]
