"""What the `fusee` command's subcommands share: the one-line failure, the exit codes, a
plain table, and reaching a server (`schedules`, `invocations` and `runs` take its
address the same way, options and token file included: `host:port?token-file=...`)."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import fusee

EXIT_OK = 0
EXIT_DAMAGED = 1  # inspect: the directory would refuse to open (acknowledged records damaged or lost)
EXIT_PARTIAL = 1  # runs bulk: some runs were refused (each named on stderr)
EXIT_USAGE = 2  # bad arguments, not a data directory, fusee-server missing, I/O error, refused call

SERVER_MISSING = (
    "this command needs the fusee-server distribution (pip install fusee-server; in the Fusee repository: "
    "pip install ./server)"
)
ADDRESS_HELP = "the server's address, with its options (host:port?token-file=...)"


class Stop(Exception):
    """A one-line message for stderr, then the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def with_client(address: str, act: Callable[[Any], Awaitable[Any]]) -> Any:
    """`act(client)` on a client of the server at `address`; a FuseeError is the
    command's one-line failure."""

    async def go() -> Any:
        from fusee.client import Client

        client = await Client.connect(address)
        try:
            return await act(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except fusee.FuseeError as error:
        raise Stop(str(error)) from None


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise argparse.ArgumentTypeError(f"{text}: give a duration above 0 and at most 3600 seconds")
    return value


def size(n: int) -> str:
    """Bytes in the largest binary unit they reach: `1.5 MiB`, `4 KiB`, `12 B`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"
