"""The call budget: Python-level calls of one uncontended acquire+release pair, against local masters.

cProfile counts the calls of ``with manager.lock()`` and ``async with manager.lock()`` (builtins and C
methods, file ``"~"``, left out), the median over PAIRS pairs, at N=1 and N=5 masters, and the calls each
extra node adds to one round. Counts, not times: they do not move on a busy machine. The collector is
off during a pair: a collection would add the calls of whatever ``gc.callbacks`` the
process carries (the suite's Hypothesis installs one), about 35 per asyncio pair at N=5.
``python -m tests.test_call_budget`` prints them.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import statistics
from typing import Any

import pytest

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.testing import RedisServers

MANAGER: dict[str, Any] = dict(ttl=10, restart_window=0, node_timeout=0.5)
PAIRS = 50
WARM = 20
#: One pair is two rounds: the acquire and the release.
ROUNDS_PER_PAIR = 2

#: The targets where the counts meet them robustly, else today's counts with room. Medians of 50 pairs on
#: Python 3.11, 3.12 and 3.13 (counted from cProfile's raw entries, see python_calls):
#: - sync N=1: 99 on all three, exact (263 before the engine's reshaping): the target, 100.
#: - asyncio N=1: 182 to 187 (344 before), exact per Python; the target, 160, is out of reach: about 70
#:   of the calls are asyncio's own (two loop turns, a timer set and cancelled, per round). 187 plus 5%.
#: - N=5 moves with how many replies each look at the sockets finds and whether the last pair's late
#:   replies (a release ends at a quorum) are read in this one: sync medians 199 to 220 (target 200;
#:   the quietest pairs make 198). The asyncio fan-out wakes its waiter for every reply, so its count
#:   follows how the five replies spread over the loop's turns: medians 388 to 504 from one run to the
#:   next on an idle machine (target 330). Budgets (220 + 18) plus 5% and 504 plus 11%.
#: - Per node and round, from those and the lowest N=1 count: (250 - 99) / 4 / 2 and (560 - 182) / 4 / 2
#:   (sync 12.5 to 15, asyncio 25 to 40; target 12).
NODE_ROUND = "per node and round"
BUDGET: dict[tuple[str, object], float] = {
    ("sync", 1): 100,
    ("sync", 5): 250,
    ("sync", NODE_ROUND): 18.875,
    ("async", 1): 196,
    ("async", 5): 560,
    ("async", NODE_ROUND): 47.25,
}


def python_calls(profile: cProfile.Profile) -> int:
    """Calls of Python functions (entries with a code object; builtins have a name instead). Read from
    the raw entries: pstats keys functions by file, line and name, and every dataclass's generated
    ``__init__`` is ("<string>", 2, "__init__"), so it would count only one of them."""
    return sum(entry.callcount for entry in profile.getstats() if not isinstance(entry.code, str))


def count_sync(manager: LockManager, name: str) -> int:
    profile = cProfile.Profile()
    gc.disable()
    try:
        profile.enable()
        with manager.lock(name):
            pass
        profile.disable()
    finally:
        gc.enable()
    return python_calls(profile)


async def count_async(manager: AsyncLockManager, name: str) -> int:
    profile = cProfile.Profile()
    gc.disable()
    try:
        profile.enable()
        async with manager.lock(name):
            pass
        profile.disable()
    finally:
        gc.enable()
    return python_calls(profile)


def median_sync(urls: list[str]) -> float:
    manager = LockManager(urls, **MANAGER)
    try:
        for i in range(WARM):
            count_sync(manager, f"budget-warm-{i}")
        return statistics.median(count_sync(manager, f"budget-{i}") for i in range(PAIRS))
    finally:
        manager.close()


def median_async(urls: list[str]) -> float:
    async def run() -> float:
        manager = AsyncLockManager(urls, **MANAGER)
        try:
            for i in range(WARM):
                await count_async(manager, f"abudget-warm-{i}")
            return statistics.median([await count_async(manager, f"abudget-{i}") for i in range(PAIRS)])
        finally:
            await manager.aclose()

    return asyncio.run(run())


def measure(urls: list[str]) -> dict[tuple[str, object], float]:
    """Medians for sync and asyncio at N=1 (the first url) and N=len(urls), and the calls per node and round."""
    counts: dict[tuple[str, object], float] = {}
    for n in (1, len(urls)):
        counts["sync", n] = median_sync(urls[:n])
        counts["async", n] = median_async(urls[:n])
    for face in ("sync", "async"):
        added = counts[face, len(urls)] - counts[face, 1]
        counts[face, NODE_ROUND] = added / (len(urls) - 1) / ROUNDS_PER_PAIR
    return counts


@pytest.fixture(scope="module")
def counts(redis_servers: RedisServers) -> dict[tuple[str, object], float]:
    redis_servers.heal()  # the suite's masters, as a new process meets them
    return measure(redis_servers.urls)


@pytest.mark.parametrize("key", list(BUDGET), ids=lambda key: f"{key[0]}-{key[1]}")
def test_the_pair_stays_within_its_call_budget(counts: dict[tuple[str, object], float], key: tuple[str, object]) -> None:
    assert counts[key] <= BUDGET[key], f"{key}: {counts[key]} Python calls, budget {BUDGET[key]}"


def main() -> None:
    servers = RedisServers(5).start()
    try:
        counts = measure(servers.urls)
    finally:
        servers.stop()
    for (face, n), value in counts.items():
        where = n if n == NODE_ROUND else f"N={n}"
        print(f"{face:5} {where}: {value:g} (budget {BUDGET[face, n]})")


if __name__ == "__main__":
    main()
