"""`fusee.sync.Client`: the client without an event loop of the caller's, for scripts and
threads. Its calls run on a loop of its own in a background thread and block until
answered; it has the asyncio client's methods with the same arguments (a listing is an
iterator, as the asyncio one is an async iterator), and it connects again by itself
after a server restart, as that one does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator
from datetime import datetime
from typing import Any, Generic, TypeVar

from fusee._audit import as_requester, requester
from fusee._errors import Failure
from fusee._sealing import AesGcm
from fusee.client import Client as AsyncClient
from fusee.client import ClientRun as AsyncRun
from fusee.engine.run_handle import RunDescription, RunSummary
from fusee.engine.schedules import ScheduleHandle
from fusee.workflow.definitions import Query, Signal, Update, Workflow
from fusee.workflow.durations import Duration

T = TypeVar("T")
Out = TypeVar("Out")


class Client:
    def __init__(
        self,
        address: str,
        *,
        token_file: str | None = None,
        tls: dict[str, str] | None = None,
        codec: AesGcm | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fusee-client", daemon=True)
        self.thread.start()
        try:
            self.inner = self._wait(AsyncClient.connect(address, token_file=token_file, tls=tls, codec=codec))
        except BaseException:
            self._stop()
            raise
        self.schedules = Schedules(self)

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        token_file: str | None = None,
        tls: dict[str, str] | None = None,
        codec: AesGcm | None = None,
    ) -> Client:
        return cls(address, token_file=token_file, tls=tls, codec=codec)

    def _wait(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        by = requester()
        if by is not None:
            # The call runs on the client's loop thread, outside this thread's context:
            # the requester named here (`fusee.as_requester`) goes with it.
            coro = _as_requester(by, coro)
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # the call is given up here; what it asked for goes on
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        version: int | None = None,
        delay: Duration | None = None,
        at: datetime | int | float | None = None,
        traceparent: str | None = None,
    ) -> Run[Out]:
        started = self.inner.start(
            wf,
            id,
            input,
            id_policy=id_policy,
            timeout=timeout,
            version=version,
            delay=delay,
            at=at,
            traceparent=traceparent,
        )
        return Run(self, self._wait(started))

    def run(self, id: str, wf: Workflow[Out] | None = None) -> Run[Out]:
        return Run(self, self.inner.run(id, wf))

    def object_ref(self, type: str, key: str) -> ObjectRef:
        """See `fusee.Client.object_ref` (docs/objects.md)."""
        return ObjectRef(self, self.inner.object_ref(type, key))

    def objects(self, type: str, limit: int | None = None) -> list[str]:
        async def keys() -> list[str]:
            return [key async for key in self.inner.objects(type, limit)]

        return self._wait(keys())

    def limit(self, name: str, *, concurrent: int | None = None, per_second: float | None = None) -> None:
        """See `fusee.Client.limit` (docs/limits.md)."""
        self._wait(self.inner.limit(name, concurrent=concurrent, per_second=per_second))

    def limits(self) -> list[dict[str, Any]]:
        return self._wait(self.inner.limits())

    def limit_usage(self, name: str) -> dict[str, int]:
        return self._wait(self.inner.limit_usage(name))

    def debounce(self, wf: Workflow[Any] | str, key: str, input: Any = None, **options: Any) -> Run[Any]:
        """See `fusee.Client.debounce` (docs/coordinators.md)."""
        return Run(self, self._wait(self.inner.debounce(wf, key, input, **options)))

    def batch(self, wf: Workflow[Any] | str, key: str, event: Any = None, **options: Any) -> Run[Any]:
        """See `fusee.Client.batch` (docs/coordinators.md)."""
        return Run(self, self._wait(self.inner.batch(wf, key, event, **options)))

    def signal_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        signal: Signal[Any] | str,
        value: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
    ) -> Run[Out]:
        started = self.inner.signal_with_start(
            wf, id, input, signal, value, id_policy=id_policy, timeout=timeout
        )
        return Run(self, self._wait(started))

    def update_with_start(
        self,
        wf: Workflow[Out] | str,
        id: str,
        input: Any,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id_policy: dict[str, str] | None = None,
        timeout: Duration | None = None,
        update_id: str | None = None,
        accepted: bool = False,
    ) -> tuple[Run[Out], Any]:
        run, value = self._wait(
            self.inner.update_with_start(
                wf,
                id,
                input,
                update,
                arg,
                id_policy=id_policy,
                timeout=timeout,
                update_id=update_id,
                accepted=accepted,
            )
        )
        return Run(self, run), value

    def schedule(self, name: str, spec: Any, wf: Workflow[Any] | str, input: Any = None) -> Schedule:
        return Schedule(self, self._wait(self.inner.schedule(name, spec, wf, input)))

    def complete(self, token: str, value: Any = None) -> None:
        self._wait(self.inner.complete(token, value))

    def fail(self, token: str, failure: BaseException | str | Failure) -> None:
        self._wait(self.inner.fail(token, failure))

    def list(
        self,
        type: str | None = None,
        status: str | None = None,
        *,
        where: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[RunSummary]:
        async def rows() -> list[RunSummary]:
            return [row async for row in self.inner.list(type, status, where=where, limit=limit)]

        return iter(self._wait(rows()))

    def call(self, method: str, shard: int | dict[str, Any] = -1, **args: Any) -> Any:
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


class Run(Generic[Out]):
    """A run's handle through a blocking client."""

    def __init__(self, client: Client, inner: AsyncRun[Out]) -> None:
        self.client = client
        self.inner = inner
        self.id = inner.id

    def __repr__(self) -> str:
        return f"<fusee.sync.Run {self.id!r}>"

    def result(self, timeout: float | None = None) -> Out:
        """The run's result; `timeout` seconds at most (TimeoutError after, the run goes on)."""
        return self.client._wait(self.inner.result(), timeout)

    def signal(self, signal: Signal[Any] | str, value: Any = None, *, id: str | None = None) -> None:
        self.client._wait(self.inner.signal(signal, value, id=id))

    def query(self, query: Query[Any, Any] | str, arg: Any = None) -> Any:
        return self.client._wait(self.inner.query(query, arg))

    def update(
        self,
        update: Update[Any, Any] | str,
        arg: Any = None,
        *,
        id: str | None = None,
        accepted: bool = False,
    ) -> Any:
        return self.client._wait(self.inner.update(update, arg, id=id, accepted=accepted))

    def status(self) -> RunSummary:
        return self.client._wait(self.inner.status())

    def started(self, timeout: float | None = None) -> RunSummary:
        """Wait until the run exists (a debounced or batched run: once its window closes)."""
        return self.client._wait(self.inner.started(), timeout)

    def describe(self) -> RunDescription:
        return self.client._wait(self.inner.describe())

    def cancel(self, reason: str | None = None) -> None:
        self.client._wait(self.inner.cancel(reason))

    def terminate(self, reason: str | None = None) -> None:
        self.client._wait(self.inner.terminate(reason))

    def reset(self, before_step: str, *, reapply_signals: bool = True) -> int:
        return self.client._wait(self.inner.reset(before_step, reapply_signals=reapply_signals))

    def retry(self) -> int:
        return self.client._wait(self.inner.retry())

    def resume(self) -> None:
        self.client._wait(self.inner.resume())


async def _as_requester(by: str, coro: Coroutine[Any, Any, T]) -> T:
    with as_requester(by):
        return await coro


class Schedules:
    """`client.schedules` through a blocking client: `get(name)`, `list()`."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def get(self, name: str) -> Schedule:
        return Schedule(self.client, self.client.inner.schedules.get(name))

    def list(self) -> list[dict[str, Any]]:
        return self.client._wait(self.client.inner.schedules.list())


class Schedule:
    """A schedule's handle through a blocking client (docs/schedules.md)."""

    def __init__(self, client: Client, inner: ScheduleHandle) -> None:
        self.client = client
        self.inner = inner
        self.name = inner.name
        self.id = inner.id

    def __repr__(self) -> str:
        return f"<fusee.sync.Schedule {self.name!r}>"

    def pause(self) -> None:
        self.client._wait(self.inner.pause())

    def resume(self) -> None:
        self.client._wait(self.inner.resume())

    def trigger(self) -> Run[Any]:
        return Run(self.client, self.client._wait(self.inner.trigger()))

    def backfill(self, start: datetime | int, end: datetime | int) -> dict[str, int]:
        return self.client._wait(self.inner.backfill(start, end))

    def describe(self) -> dict[str, Any]:
        return self.client._wait(self.inner.describe())

    def delete(self) -> None:
        self.client._wait(self.inner.delete())


class ObjectRef:
    """A key of an object type, its calls blocking (see `fusee.ObjectRef`)."""

    def __init__(self, client: Client, inner: Any) -> None:
        self._client = client
        self.inner = inner
        self.type, self.key, self.id = inner.type, inner.key, inner.id

    def __repr__(self) -> str:
        return f"<fusee.sync.ObjectRef {self.id!r}>"

    def __getattr__(self, name: str) -> Any:
        # Every method of the asyncio ref (call, send, state, inspect, describe, delete and
        # the edits), each run on the client's loop and waited for.
        method = getattr(self.inner, name)
        if not callable(method) or name.startswith("_"):
            raise AttributeError(name)

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._client._wait(method(*args, **kwargs))

        return blocking
