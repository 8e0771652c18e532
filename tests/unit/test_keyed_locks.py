"""KeyedLocks serialise holders of one key and keep no entry for a key no one holds."""

from __future__ import annotations

import asyncio

from sandbox_workspace.api.keyed_locks import KeyedLocks


def test_holders_of_a_key_take_turns_and_nothing_is_kept_after():
    locks = KeyedLocks()
    inside: list[str] = []
    order: list[str] = []

    async def hold(key: str, name: str) -> None:
        async with locks.hold(key):
            inside.append(name)
            assert [n for n in inside if n.startswith(key)] == [name]  # alone for its key
            order.append(name)
            await asyncio.sleep(0.01)
            inside.remove(name)

    async def main() -> None:
        await asyncio.gather(*(hold(k, f"{k}{i}") for k in "ab" for i in range(5)))
        assert len(locks) == 0
        for i in range(10_000):  # a user looping over random ids
            async with locks.hold(f"random-{i}"):
                pass
        assert len(locks) == 0

    asyncio.run(main())
    assert sorted(order) == sorted(f"{k}{i}" for k in "ab" for i in range(5))


def test_a_holder_that_fails_releases_its_key():
    locks = KeyedLocks()

    async def main() -> None:
        try:
            async with locks.hold("k"):
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert len(locks) == 0
        async with locks.hold("k"):  # free again
            pass

    asyncio.run(main())
