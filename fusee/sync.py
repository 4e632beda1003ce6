"""`fusee.sync.Client`: the client without an event loop of the caller's, for scripts and
threads. Its calls run on a loop of its own in a background thread and block until
answered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from fusee.client import Client as AsyncClient
from fusee.client import ClientRun as AsyncRun
from fusee.engine.handle import RunSummary

T = TypeVar("T")


class Client:
    def __init__(
        self, address: str, *, token_file: str | None = None, tls: dict[str, str] | None = None
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fusee-client", daemon=True)
        self.thread.start()
        try:
            self.inner = self._wait(AsyncClient.connect(address, token_file=token_file, tls=tls))
        except BaseException:
            self._stop()
            raise

    @classmethod
    def connect(
        cls, address: str, *, token_file: str | None = None, tls: dict[str, str] | None = None
    ) -> Client:
        return cls(address, token_file=token_file, tls=tls)

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def start(self, workflow: Any, id: str, input: Any = None, **options: Any) -> Run:
        self._wait(self.inner.start(workflow, id, input, **options))
        return Run(self, id)

    def signal_with_start(self, workflow: Any, id: str, input: Any, signal: Any, value: Any = None) -> Run:
        self._wait(self.inner.signal_with_start(workflow, id, input, signal, value))
        return Run(self, id)

    def update_with_start(
        self, workflow: Any, id: str, input: Any, update: Any, arg: Any = None, **options: Any
    ) -> tuple[Run, Any]:
        _, value = self._wait(self.inner.update_with_start(workflow, id, input, update, arg, **options))
        return Run(self, id), value

    def run(self, id: str) -> Run:
        return Run(self, id)

    def complete(self, token: str, value: Any = None) -> None:
        self._wait(self.inner.complete(token, value))

    def fail(self, token: str, message: str) -> None:
        self._wait(self.inner.fail(token, message))

    def list(self, type: str | None = None, status: str | None = None) -> list[RunSummary]:
        return self._wait(self.inner.list(type, status))

    def call(self, method: str, shard: int, **args: Any) -> Any:
        return self._wait(self.inner.call(method, shard, **args))

    def close(self) -> None:
        if self.loop.is_running():
            self._wait(self.inner.close())
        self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class Run:
    """A run's handle through a blocking client."""

    def __init__(self, client: Client, id: str) -> None:
        self.client = client
        self.id = id
        self.inner = AsyncRun(client.inner, id)

    def result(self) -> Any:
        return self.client._wait(self.inner.result())

    def signal(self, signal: Any, value: Any = None) -> None:
        self.client._wait(self.inner.signal(signal, value))

    def query(self, query: Any, arg: Any = None) -> Any:
        return self.client._wait(self.inner.query(query, arg))

    def update(self, update: Any, arg: Any = None, *, id: str | None = None) -> Any:
        return self.client._wait(self.inner.update(update, arg, id=id))

    def cancel(self, reason: str | None = None) -> None:
        self.client._wait(self.inner.cancel(reason))

    def terminate(self, reason: str | None = None) -> None:
        self.client._wait(self.inner.terminate(reason))

    def describe(self) -> RunSummary:
        return self.client._wait(self.inner.describe())
