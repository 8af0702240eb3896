"""``cancel_and_wait(task)``: the explicit cancellation every owner of a background task ends with.

Cancel the task and await it, so that its ``finally`` blocks have run when this returns; the
``CancelledError`` it ends with is absorbed (any other error it raised propagates). ``None`` and an
already finished task are fine."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
