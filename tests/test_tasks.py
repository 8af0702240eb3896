"""``cancel_and_wait``: the task's ``finally`` has run when it returns; its own errors still surface."""

from __future__ import annotations

import asyncio

import pytest

from pearl.tasks import cancel_and_wait


def test_cancel_and_wait_runs_the_tasks_cleanup_and_absorbs_only_the_cancellation() -> None:
    async def main() -> None:
        cleaned: list[str] = []

        async def sleeper() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                cleaned.append("done")

        t = asyncio.get_running_loop().create_task(sleeper())
        await asyncio.sleep(0)
        await cancel_and_wait(t)
        assert cleaned == ["done"] and t.cancelled()
        await cancel_and_wait(None)
        await cancel_and_wait(t)  # already finished: nothing to do

        async def broken() -> None:
            raise RuntimeError("boom")

        b = asyncio.get_running_loop().create_task(broken())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="boom"):
            await cancel_and_wait(b)

    asyncio.run(main())
