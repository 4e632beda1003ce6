"""The threads `thread=True` steps (and synchronous steps with a timeout) run on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

STEP_THREADS = 32


class StepThreads:
    """An engine's own threads for steps, so steps that never return cannot starve
    anything else that uses threads (the disk path has its own, the event loop's default
    executor is left to the application). A timed-out synchronous step keeps its thread
    until its function returns (Python cannot stop a thread): once all of them are held
    so, thread steps wait for one to return (docs/engine.md). Made on first use."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None

    def get(self) -> ThreadPoolExecutor:
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor  # loaded by the first thread step

            self.pool = ThreadPoolExecutor(max_workers=STEP_THREADS, thread_name_prefix="fusee-step")
        return self.pool

    def stop(self) -> None:
        # Never waits: a step function that does not return must not hang the close.
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
