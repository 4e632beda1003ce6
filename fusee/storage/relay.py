"""The relay of a storage held in one process (memory, local mode): messages and
acknowledgments for a shard reach the engine that holds it, or wait until one does.
(Server mode's relay is the server's; this is what stands for it in a process.)"""

from __future__ import annotations

import asyncio

from fusee.journal import Ack, Msg
from fusee.storage.contract import Receive


class Relay:
    def __init__(self) -> None:
        self.receivers: dict[int, Receive] = {}
        self.waiting: dict[int, list[Msg | Ack]] = {}

    def attach(self, index: int, receive: Receive) -> None:
        """`receive` now holds shard `index`; what waited for a holder goes to it."""
        self.receivers[index] = receive
        loop = asyncio.get_running_loop()
        for item in self.waiting.pop(index, []):
            loop.call_soon(receive, item)

    def detach(self, index: int, receive: Receive) -> None:
        if self.receivers.get(index) is receive:
            del self.receivers[index]

    def send(self, index: int, item: Msg | Ack) -> None:
        # Always on a later turn: the sender is in the middle of its own bookkeeping.
        receive = self.receivers.get(index)
        if receive is None:
            self.waiting.setdefault(index, []).append(item)
        else:
            asyncio.get_running_loop().call_soon(receive, item)
