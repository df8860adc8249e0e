"""Handing a held lock to another process, and re-entering a lock one already holds (real servers)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable
from tests.conftest import eventually, on_nodes


def stored(servers, resource):
    return on_nodes(servers, "get", resource)


def take_over(urls, resource, token, fencing_token, queue):
    """In another process: rebuild the handle, check it, extend it, read its token, release it."""
    manager = LockManager(urls, restart_window=0)
    try:
        lock = manager.adopt(resource, token, ttl=20.0, fencing_token=fencing_token)
        owned = lock.owned()
        lock.extend()
        queue.put((owned, lock.validity, lock.fencing_token, lock.release()))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put(repr(exc))
    finally:
        manager.close()


def test_a_lock_taken_in_one_process_is_extended_and_released_in_another(mgr, servers):
    lock = mgr.acquire(["invoice-7", "invoice-8"], ttl=5.0)
    token = lock.fencing_token
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=take_over, args=(servers.urls, ["invoice-7", "invoice-8"], lock.token, token, queue))
    child.start()
    result = queue.get(timeout=30)
    child.join(10)
    owned, validity, fencing, released = result
    assert owned is True
    assert 15.0 < validity <= 20.0  # extended to the ttl the adopter asked for
    assert fencing == token  # the token already issued travels with the handle
    assert released is True
    # release() returned once a quorum deleted the keys; the other nodes follow within a moment.
    eventually(lambda: stored(servers, "invoice-7") == stored(servers, "invoice-8") == [None] * len(servers))
    # The first handle now finds the lock gone, and says so.
    assert lock.owned() is False and lock.lost


def test_an_adopted_handle_is_valid_only_as_long_as_the_nodes_keep_the_key(mgr):
    lock = mgr.acquire("short", ttl=2.0)
    handle = mgr.adopt("short", lock.token)
    assert 1.5 < handle.validity <= lock.validity + 0.01  # read from the nodes, never longer than theirs
    assert handle.value == lock.value and handle.holder == lock.holder
    with pytest.raises(LockNotAcquired):
        mgr.acquire("short", blocking=False)  # still one lock, held through either handle
    handle.release()
    assert lock.owned() is False


def test_a_new_fencing_token_from_an_adopted_handle_is_higher(mgr):
    lock = mgr.acquire("fenced")
    first = lock.fencing_token
    handle = mgr.adopt("fenced", lock.token)
    assert handle.fencing_token > first
    handle.release()


def test_adopting_a_released_or_unknown_lock_is_refused(mgr):
    lock = mgr.acquire("gone")
    lock.release()
    with pytest.raises(LockLost, match="0 of 5 nodes store the token's value"):
        mgr.adopt("gone", lock.token)
    other = mgr.acquire("gone")
    with pytest.raises(LockLost):
        mgr.adopt("gone", lock.token)  # another holder's value is there now: never adopted
    other.release()


def test_adopting_with_too_few_nodes_answering_says_so(mgr, servers):
    lock = mgr.acquire("dark")
    for s in servers[:3]:
        s.pause()
    with pytest.raises(QuorumUnavailable, match="too few answered"):
        mgr.adopt("dark", lock.token)
    servers.heal()
    lock.release()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token": ""}, "token must be"),
        ({"token": 5}, "token must be"),
        ({"token": "t", "fencing_token": "3"}, "fencing_token must be an int"),
        ({"token": "t", "ttl": -1}, "ttl must be"),
    ],
)
def test_adopt_checks_its_arguments(mgr, kwargs, message):
    with pytest.raises(ValueError, match=message):
        mgr.adopt("r", **kwargs)


def test_acquiring_what_this_thread_holds_says_so(mgr):
    held = mgr.acquire("mine")
    with pytest.raises(LockNotAcquired, match="held by this very thread 'MainThread'.*reentrant=True"):
        mgr.acquire("mine", blocking=False)
    errors = []

    def elsewhere():
        try:
            mgr.acquire("mine", blocking=False)
        except LockNotAcquired as exc:
            errors.append(str(exc))

    t = threading.Thread(target=elsewhere, name="worker-2")
    t.start()
    t.join(10)
    assert "This process holds 'mine', in thread 'MainThread'." in errors[0]
    assert "this very" not in errors[0]
    held.release()


def test_reentrant_locks_count_entries_and_release_on_the_outermost(mgr, servers):
    with mgr.lock(["ra", "rb"], reentrant=True, auto_extend=True) as outer:
        with mgr.lock("ra", reentrant=True) as inner:  # part of what is held: entered again
            assert inner is outer
            assert outer._depth == 2
        assert outer.locked()
        eventually(lambda: stored(servers, "ra")[0] == outer.value.encode())
        again = mgr.acquire(["rb", "ra"], reentrant=True)
        assert again is outer and again.release() is True and outer.locked()
        with pytest.raises(LockNotAcquired, match="covers only part of it"):
            mgr.acquire(["ra", "rc"], reentrant=True)
    assert not outer.locked()
    eventually(lambda: stored(servers, "ra") == stored(servers, "rb") == [None] * len(servers))


def test_one_hold_entered_again_within_itself_releases_at_its_outermost_exit(mgr, servers):
    """A recursive function guarding itself with one ``manager.lock(..., reentrant=True)``: each
    exit leaves its own entry, and the outermost releases the lock."""
    hold = mgr.lock("recursive", reentrant=True, auto_extend=True)
    entered = []

    def walk(depth):
        with hold as lock:
            entered.append(lock._depth)
            if depth:
                walk(depth - 1)
        return lock

    lock = walk(2)
    assert entered == [1, 2, 3]
    assert lock.released and not lock.lost
    assert not mgr.is_locked("recursive")
    assert hold.leave() is None  # nothing left to leave


async def test_one_async_hold_entered_again_within_itself_releases_at_its_outermost_exit(servers):
    m = AsyncLockManager(servers.urls, restart_window=0)
    hold = m.lock("recursive-async", reentrant=True, auto_extend=True)

    async def walk(depth):
        async with hold as lock:
            if depth:
                await walk(depth - 1)
        return lock

    try:
        lock = await walk(2)
        assert lock.released and not lock.lost
        assert not await m.is_locked("recursive-async")
        assert await hold.leave() is None
    finally:
        await m.aclose()


def test_an_entry_whose_validity_ran_out_reports_the_loss_at_its_own_exit(mgr):
    """Not only the outermost: an inner entry's block that outlived the lock ran without it."""
    with pytest.raises(LockLost, match="expired"):
        with mgr.lock("inner-expiry", ttl=0.2, reentrant=True) as outer:
            with pytest.raises(LockLost, match="expired"):
                with mgr.lock("inner-expiry", reentrant=True) as inner:
                    assert inner is outer
                    eventually(lambda: inner.validity == 0)
            assert outer.lost and not outer.released


def test_an_expired_inner_entry_of_a_watched_lock_reports_on_lost_once(mgr):
    lost = []
    with pytest.raises(LockLost, match="expired"):
        with mgr.lock("inner-expiry-watched", ttl=0.2, reentrant=True, auto_extend=True, max_hold=0.001, on_lost=lost.append):
            with mgr.lock("inner-expiry-watched", reentrant=True) as inner:
                eventually(lambda: inner.validity == 0)
    eventually(lambda: lost == [inner])
    assert lost == [inner]


def test_reentry_is_per_thread(mgr):
    outer = mgr.acquire("per-thread", reentrant=True)
    got = []

    def other():
        try:
            mgr.acquire("per-thread", reentrant=True, blocking=False)
        except LockNotAcquired:
            got.append("refused")

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert got == ["refused"]  # another thread does not hold it: it must wait like anyone else
    outer.release()


async def test_reentry_is_per_asyncio_task_and_async_adopt_works(servers):
    m = AsyncLockManager(servers.urls, restart_window=0)
    async with m.lock("task", reentrant=True) as outer:
        inner = await m.acquire("task", reentrant=True)
        assert inner is outer
        await inner.release()
        assert outer.locked()

        async def other_task():
            with pytest.raises(LockNotAcquired):
                await m.acquire("task", reentrant=True, blocking=False)

        await asyncio.create_task(other_task())
        handle = await m.adopt("task", outer.token)
        assert await handle.owned()
    await m.aclose()


def test_an_extension_never_shortens_the_keys_another_handle_counts_on(servers):
    long = LockManager(servers.urls, ttl=20.0, restart_window=0)
    short = LockManager(servers.urls, ttl=2.0, restart_window=0)
    lock = long.acquire("shorten")
    handle = short.adopt("shorten", lock.token)  # extends to 2 s by default
    handle.extend()
    assert min(on_nodes(servers, "pttl", "shorten")) > 15_000  # still what the first handle counts on
    assert 1.0 < handle.validity <= 2.0 and lock.validity > 15.0
    lock.release()
    long.close()
    short.close()


def test_a_lock_kept_by_a_finished_thread_is_not_entered_by_the_next(mgr):
    kept = []
    t = threading.Thread(target=lambda: kept.append(mgr.acquire("left-behind", ttl=20)))
    t.start()
    t.join(10)
    entered = []

    def later():
        try:
            entered.append(mgr.acquire("left-behind", reentrant=True, blocking=False))
        except LockNotAcquired:
            pass

    for _ in range(20):  # thread ids are reused; the lock must never be handed to a newcomer
        other = threading.Thread(target=later)
        other.start()
        other.join(10)
    assert entered == [] and kept[0]._depth == 1
    kept[0].release()


def test_adopting_part_of_a_set_is_refused(mgr):
    lock = mgr.acquire(["part-a", "part-b"])
    with pytest.raises(ValueError, match="holds 2 resource"):
        mgr.adopt("part-a", lock.token)
    assert mgr.adopt(["part-b", "part-a"], lock.token).resources == ("part-a", "part-b")
    lock.release()


def test_a_reentrant_call_still_checks_its_arguments(mgr):
    with mgr.lock("checked", reentrant=True):
        with pytest.raises(ValueError, match="ttl"):
            mgr.acquire("checked", ttl=-5, reentrant=True)
        with pytest.raises(ValueError, match="label"):
            mgr.acquire("checked", label=3, reentrant=True)


async def test_a_call_cancelled_between_votes_leaves_the_line_at_once(servers):
    holder = LockManager(servers.urls, restart_window=0)
    held = holder.acquire("between")
    m = AsyncLockManager(servers.urls, restart_window=0, retry_delay=1.0, retry_jitter=0.0)
    for s in servers[:3]:
        s.pause()  # too few nodes answer: the call sleeps retry_delay between votes
    task = asyncio.create_task(m.acquire("between", timeout=10))
    await asyncio.sleep(0.3)  # its first vote is over (node_timeout 50 ms); it sleeps until t=1.05 s
    reachable = [redis.Redis.from_url(s.url, socket_timeout=2) for s in servers[3:]]
    assert all(c.zcard("redlock:places:between") == 1 for c in reachable)  # its place from the vote
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = asyncio.get_running_loop().time() + 0.3
    while any(c.zcard("redlock:places:between") for c in reachable):
        # Without the release on cancellation the place would stay until it expires (~1 s after the vote).
        assert asyncio.get_running_loop().time() < deadline, "the cancelled call is still in line"
        await asyncio.sleep(0.01)
    servers.heal()
    held.release()
    holder.close()
    await m.aclose()
