"""Whether work on the event loop lets other work run between its steps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def with_work_beside(work: Awaitable[T]) -> tuple[T, int]:
    """`work` run to its end on a fresh loop beside a task that counts the loop turns it
    is given meanwhile: what `work` returned, and those turns."""

    async def main() -> tuple[T, int]:
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        try:
            return await work, turns
        finally:
            beside.cancel()

    return asyncio.run(main())
