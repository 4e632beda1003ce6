"""Completion tokens: what a step that completes outside its run (a webhook, another
process) is handed, and how the engine reads one back and takes the completion it
carries (docs/engine.md, *Completion tokens*)."""

from __future__ import annotations

import base64
from _blake2 import blake2b  # hashlib's own BLAKE2, without loading OpenSSL's (cold path)
from collections.abc import Callable
from typing import Protocol

import msgspec

from fusee import _names as names
from fusee import journal as R
from fusee._errors import Failure, RejectedError
from fusee.engine.run import RunState
from fusee.workflow.ops import StepOp, StepState


class _Appended(Protocol):
    appended: int


class CompletingShard(Protocol):
    """What taking a completion needs of the shard of the token's run."""

    @property
    def durability(self) -> _Appended: ...
    async def load(self, wid: str) -> RunState | None: ...
    async def durable_at(self, lsn: int) -> None: ...


def make_token(wid: str, run: int, seq: int, attempt: int, seed: int) -> str:
    """A completion token names the run, the step and the attempt; its MAC, keyed by
    the run's recorded seed (63 bits from `os.urandom`), makes it hard to forge and lets a
    stale one be refused. docs/engine.md, *Completion tokens*, says what that rests on."""
    body = msgspec.json.encode([wid, run, seq, attempt])
    mac = blake2b(body, key=seed.to_bytes(8, "big"), digest_size=12).digest()
    return base64.urlsafe_b64encode(body).decode().rstrip("=") + "." + base64.urlsafe_b64encode(mac).decode()


def parse_token(token: str) -> tuple[str, int, int, int, str]:
    try:
        if type(token) is not str:
            raise TypeError
        body, mac = token.split(".", 1)
        wid, run, seq, attempt = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if not (type(wid) is str and type(run) is int and type(seq) is int and type(attempt) is int):
            raise TypeError
        return names.name(wid, "workflow ID"), run, seq, attempt, mac
    except (ValueError, TypeError, msgspec.DecodeError, RejectedError):
        raise RejectedError("not a completion token") from None


async def take_completion(
    shard_of: Callable[[str], CompletingShard], token: str, value: bytes | None, failure: Failure | None
) -> None:
    """`Engine.complete`/`fail`: the step the token names ends with `value` or `failure`,
    recorded before this returns; a token whose step finished or moved on to a newer
    attempt (or that was never made for this run) is refused."""
    wid, run_no, seq, attempt, _mac = parse_token(token)
    shard = shard_of(wid)
    state = await shard.load(wid)
    # A run begun by a reset takes the tokens its copy handed out (docs/run-operations.md).
    ours = state is not None and (state.run_no == run_no or state.inherited.get(seq) == run_no)
    op = state.ops.get(seq) if state is not None and ours else None
    if (
        state is None
        or op is None
        or op.done
        # The token is out once the send function has it: a completion may come back
        # before that function returns (a fast webhook), and is taken then too.
        or not isinstance(op, StepOp)
        or op.state is StepState.IDLE
        or op.attempt != attempt
        or make_token(wid, run_no, seq, attempt, state.started.seed) != token
    ):
        await shard.durable_at(shard.durability.appended)  # the refusal rests on durable state only
        raise RejectedError("the completion token is stale: its step finished, or a newer attempt holds it")
    state.event(R.Completed(seq, value, failure))
    await shard.durable_at(state.last_lsn)
