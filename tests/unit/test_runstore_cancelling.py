"""A Redis retry loop ends when cancelled even if the cancellation surfaces as a
connection error (as redis-py may answer one that lands inside a command)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.chat.runstore.cancelling import end_if_cancelling


async def _retry_loop(attempts: list[int]) -> None:
    while True:
        try:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                raise ConnectionError("Connection closed by server.") from None
        except ConnectionError as e:
            attempts.append(1)
            end_if_cancelling(e)


async def test_a_cancellation_disguised_as_a_connection_error_ends_the_loop():
    attempts: list[int] = []
    task = asyncio.create_task(_retry_loop(attempts))
    await asyncio.sleep(0)
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert attempts == [1]


async def test_a_real_connection_error_is_left_to_the_loop():
    async def once() -> str:
        try:
            raise ConnectionError("refused")
        except ConnectionError as e:
            end_if_cancelling(e)
            return "retried"

    assert await once() == "retried"
