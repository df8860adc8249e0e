"""Who owns a lock for ``reentrant=True`` (pooled threads, native threads), and forking while
another thread holds the manager's books (real servers)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import faulthandler
import functools
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from django_redlock import get_lock_manager
from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockNotAcquired


@pytest.fixture
def m(servers):
    manager = LockManager(servers.urls, ttl=10.0, node_timeout=0.2, restart_window=0)
    yield manager
    manager.close()


def take(manager, resource):
    """Acquire ``resource`` with ``reentrant=True`` without waiting: (the lock, the thread id) or
    ("refused", the thread id)."""
    try:
        return manager.acquire(resource, reentrant=True, blocking=False), threading.get_ident()
    except LockNotAcquired:
        return "refused", threading.get_ident()


def take_and_enter(manager, resource):
    """Within one call: acquire, then enter the same lock again; leave the outer entry held."""
    outer = manager.acquire(resource, reentrant=True, blocking=False)
    inner = manager.acquire(resource, reentrant=True, blocking=False)
    assert inner is outer and outer._depth == 2
    inner.release()
    return outer, threading.get_ident()


async def two_tasks_on_one_thread(run, manager, resource):
    """Task A takes the lock in one call and keeps it; task B then asks for it in a call that runs on
    the same thread. Returns what B got, and both thread ids."""
    a_holds = asyncio.Event()
    a_may_release = asyncio.Event()
    seen = {}

    async def task_a():
        lock, seen["a"] = await run(take_and_enter, manager, resource)
        a_holds.set()
        await a_may_release.wait()
        await run(lock.release)

    async def task_b():
        await a_holds.wait()
        seen["b_got"], seen["b"] = await run(take, manager, resource)
        a_may_release.set()

    await asyncio.gather(task_a(), task_b())
    return seen


def via_sync_to_async(func, *args):
    return sync_to_async(func, thread_sensitive=True)(*args)


def in_pool(pool):
    def run(func, *args):
        return asyncio.get_running_loop().run_in_executor(pool, functools.partial(func, *args))

    return run


async def test_two_tasks_whose_sync_to_async_calls_share_a_thread_never_share_a_lock(m):
    seen = await two_tasks_on_one_thread(via_sync_to_async, m, "s2a")
    assert seen["a"] == seen["b"]  # asgiref ran both tasks' calls on its one thread-sensitive thread
    assert seen["b_got"] == "refused"  # B is not the task that holds it: it must wait like anyone else
    assert m.acquire("s2a", blocking=False).release()  # A's release released it


async def test_two_tasks_whose_executor_jobs_share_a_thread_never_share_a_lock(m):
    with ThreadPoolExecutor(max_workers=1) as pool:
        seen = await two_tasks_on_one_thread(in_pool(pool), m, "pooled")
    assert seen["a"] == seen["b"]
    assert seen["b_got"] == "refused"
    assert m.acquire("pooled", blocking=False).release()


def test_two_tasks_whose_sync_to_async_calls_run_on_the_outer_sync_thread_never_share_a_lock(m):
    """Under async_to_sync (a WSGI server's async middleware), thread-sensitive calls run back on the
    sync thread that waits for the async code, through asgiref's own executor."""

    async def main():
        return await two_tasks_on_one_thread(via_sync_to_async, m, "outer-thread")

    seen = async_to_sync(main)()
    assert seen["a"] == seen["b"] == threading.get_ident()
    assert seen["b_got"] == "refused"
    assert m.acquire("outer-thread", blocking=False).release()


@pytest.mark.usefixtures("redlock_settings")
async def test_a_sync_view_under_asgi_enters_the_lock_its_sync_middleware_holds():
    """Under ASGI, Django runs the sync middleware in one sync_to_async call; the innermost one's
    async_to_sync runs the view back on that thread in a call of its own, while the middleware's
    call waits beneath it on the same thread."""
    from django.test import AsyncClient, override_settings

    with override_settings(MIDDLEWARE=["tests.views.AccountLockMiddleware"]):
        response = await AsyncClient().get("/account/")
    assert response.content.decode() == "entered at depth 2"
    assert not await sync_to_async(get_lock_manager().is_locked)("account")


def test_two_greenlets_of_one_thread_never_share_a_lock(m):
    """gevent, eventlet: a greenlet is the owner, not the thread all of them run on (also when
    django_redlock was imported before gevent's monkey-patching)."""
    greenlet = pytest.importorskip("greenlet")
    hub = greenlet.getcurrent()

    def first():
        lock = m.acquire("glet", reentrant=True, blocking=False)
        assert m.acquire("glet", reentrant=True, blocking=False) is lock  # its own lock, entered
        hub.switch(lock)  # keeps it while another greenlet runs
        lock.release()
        lock.release()

    holder = greenlet.greenlet(first)
    lock = holder.switch()
    assert greenlet.greenlet(lambda: take(m, "glet")[0]).switch() == "refused"
    outer = m.acquire("glet-thread", reentrant=True, blocking=False)  # the thread's first greenlet
    assert greenlet.greenlet(lambda: take(m, "glet-thread")[0]).switch() == "refused"
    outer.release()
    holder.switch()
    assert holder.dead and not lock.locked()
    assert m.acquire("glet", blocking=False).release()


async def test_a_blocking_call_from_another_task_on_the_same_thread_waits_for_the_holder(m):
    """A blocking call in another task's job on the holder's thread waits in line and gives up after its
    timeout: it never enters."""
    lock, _ = await via_sync_to_async(take, m, "wait-in-line")

    def blocked():
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="timeout|attempts|agreed"):
            m.acquire("wait-in-line", reentrant=True, blocking=True, timeout=0.5)
        return time.monotonic() - started

    waited = await asyncio.create_task(via_sync_to_async(blocked))
    assert waited >= 0.4
    assert lock.locked() and lock._depth == 1
    await via_sync_to_async(lock.release)


async def test_a_task_that_holds_a_lock_from_an_earlier_sync_to_async_call_is_a_stranger_in_the_next(m):
    """What a call on a pooled thread holds belongs to that call: asgiref does not tell the sync side
    which task launched it."""
    lock, _ = await via_sync_to_async(take, m, "next-call")
    again, _ = await via_sync_to_async(take, m, "next-call")
    assert again == "refused"
    await via_sync_to_async(lock.release)


def test_a_thread_keeps_its_reentrancy(m):
    with ThreadPoolExecutor(max_workers=1) as pool:
        lock, _ = pool.submit(take_and_enter, m, "in-one-job").result(10)
        assert lock._depth == 1
        got, _ = pool.submit(take, m, "in-one-job").result(10)  # the next job on the same thread
        assert got == "refused"
    lock.release()
    outer = m.acquire("plain-thread", reentrant=True)
    assert m.acquire("plain-thread", reentrant=True) is outer
    outer.release()
    outer.release()


async def test_async_locks_belong_to_the_task_even_through_async_to_sync_on_a_pooled_thread(servers):
    """The async manager's owner is the task: two sync_to_async calls that each run async_to_sync
    code get two tasks, never one owner."""
    am = AsyncLockManager(servers.urls, ttl=10.0, node_timeout=0.2, restart_window=0)

    async def take_async():
        try:
            return await am.acquire("async-owner", reentrant=True, blocking=False)
        except LockNotAcquired:
            return "refused"

    first = await via_sync_to_async(async_to_sync(take_async))
    second = await via_sync_to_async(async_to_sync(take_async))
    assert second == "refused"
    await first.release()
    await am.aclose()


# Native threads: started by C (pthread_create), so Python only sees them as threading._DummyThread.

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def in_native_thread(func):
    """Run ``func()`` in a thread created by pthread_create; return its result and its thread object."""
    out = {}

    def body(_arg):
        try:
            out["result"] = func()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["result"] = exc
        out["thread"] = threading.current_thread()
        out["ident"] = threading.get_ident()
        return None

    start = START(body)
    handle = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(handle), None, start, None) == 0
    assert libc.pthread_join(handle, None) == 0
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pthread_create through ctypes")
def test_native_threads_that_reuse_a_thread_id_do_not_enter_each_others_lock(m):
    first = in_native_thread(lambda: take_and_enter(m, "native"))
    assert not isinstance(first["result"], BaseException), first["result"]
    lock = first["result"][0]
    assert isinstance(first["thread"], threading._DummyThread)
    second = in_native_thread(lambda: take(m, "native")[0])
    assert second["ident"] == first["ident"]  # the id is reused (glibc keeps the thread's stack)
    assert second["result"] == "refused"
    assert lock._depth == 1
    lock.release()


# Forking while another thread holds the manager's books.


def fork_children(count, work):
    """Fork ``count`` children, one after another, each running ``work()`` and leaving with its exit code;
    return the numbers of the children that hung (killed after 10 s) and of those that failed."""
    stuck, failed = [], []
    for n in range(count):
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(8.0)  # a hung child shows where, before it is killed
            try:
                work(n)
                code = 0
            except BaseException:  # noqa: BLE001 - the exit code says it
                code = 1
            os._exit(code)  # never return into pytest
        deadline = time.monotonic() + 10.0
        while not (done := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                stuck.append(n)
                break
            time.sleep(0.005)
        else:
            if os.waitstatus_to_exitcode(done[1]) != 0:
                failed.append(n)
    return stuck, failed


def busy_parent(loop_once, threads=1):
    """Threads that run ``loop_once()`` until stopped; returns a function that stops them and says how
    many times they ran it."""
    stop, runs = threading.Event(), [0]

    def run():
        while not stop.is_set():
            loop_once()
            runs[0] += 1

    started = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in started:
        t.start()

    def stopped():
        stop.set()
        for t in started:
            t.join(10)
        return runs[0]

    return stopped


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_reenters_a_lock_acquires_and_releases(m):
    held = []

    def reenter():
        if not held:
            held.append(m.acquire("busy-parent", ttl=60, reentrant=True))  # the thread keeps it
        with m.lock("busy-parent", reentrant=True) as inner:
            assert inner is held[0]

    stopped = busy_parent(reenter)
    try:
        stuck, failed = fork_children(80, lambda n: m.acquire(f"child-{n}", blocking=True, timeout=5).release())
    finally:
        entries = stopped()
        held[0].release()
    assert entries > 80  # the parent really was re-entering the whole time
    assert (stuck, failed) == ([], []), f"{len(stuck)} of 80 children hung, {len(failed)} failed"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_starts_event_loops_acquires_and_releases(servers):
    am = AsyncLockManager(servers.urls, ttl=10.0, node_timeout=0.2, restart_window=0)

    async def once(resource):
        await (await am.acquire(resource, blocking=True, timeout=5)).release()
        await am.aclose()  # this loop's connections

    # Each new event loop gets its own books, under the node's mutex.
    stopped = busy_parent(lambda: asyncio.run(once(f"busy-loops-{threading.get_ident()}")), threads=3)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: a fork then often finds a mutex held
    try:
        stuck, failed = fork_children(80, lambda n: asyncio.run(once(f"async-child-{n}")))
    finally:
        sys.setswitchinterval(interval)
        runs = stopped()
    assert runs > 80
    assert (stuck, failed) == ([], []), f"{len(stuck)} of 80 children hung, {len(failed)} failed"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_every_mutex_of_the_package_is_free_in_a_child_forked_while_another_thread_holds_it(m, servers):
    from django_redlock import manager as django_managers

    am = AsyncLockManager(servers.urls, restart_window=0)
    mutexes = {
        "HeldLocks": (m._held, "_mutex"),
        "async HeldLocks": (am._held, "_mutex"),
        "AsyncNode": (am.anodes[0], "_pools_lock"),
        "get_lock_manager": (django_managers, "_lock"),
    }
    holding, done = threading.Event(), threading.Event()

    def hold():
        taken = [getattr(owner, name) for owner, name in mutexes.values()]
        for mutex in taken:
            mutex.acquire()
        holding.set()
        done.wait(30)
        for mutex in taken:
            mutex.release()

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            free = [getattr(owner, name).acquire(timeout=2) for owner, name in mutexes.values()]
            os._exit(0 if all(free) else 1 + free.index(False))
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        t.join(10)
    code = os.waitstatus_to_exitcode(status)
    assert code == 0, f"{list(mutexes)[code - 1]}'s mutex stayed held in the child"


# -- a lock held further out is lent to one call within it at a time ---------------------------


def _siblings(manager, enter_through_sync_to_async: bool) -> list[str]:
    """The thread holds "lent"; two gathered tasks run within it, each entering with reentrant=True
    and holding across an await. Returns what each did."""

    log: list[str] = []
    inside: list[str] = []

    def take(name):
        try:
            lock = manager.acquire("lent", reentrant=True, blocking=False)
        except LockNotAcquired:
            log.append(f"{name} refused")
            return None
        inside.append(name)
        log.append(f"{name} entered with {len(inside)} inside")
        return lock

    def give(name, lock):
        inside.remove(name)
        lock.release()

    async def child(name):
        lock = await sync_to_async(take)(name) if enter_through_sync_to_async else take(name)
        if lock is not None:
            await asyncio.sleep(0.2)  # the sibling runs meanwhile
            await sync_to_async(give)(name, lock) if enter_through_sync_to_async else give(name, lock)

    async def main():
        await asyncio.gather(child("first"), child("second"))

    outer = manager.acquire("lent", reentrant=True, blocking=False)
    try:
        if enter_through_sync_to_async:
            async_to_sync(main)()  # the tasks' sync_to_async calls run back on this thread
        else:
            asyncio.run(main())  # the tasks run on this thread
    finally:
        assert outer.release()
    return log


@pytest.mark.parametrize("through", ["sync_to_async", "asyncio.run"])
def test_two_tasks_within_the_holder_never_hold_its_lock_at_once(manager, through):
    """A thread that holds a lock and runs tasks (asyncio.run, or async_to_sync whose sync_to_async
    calls run back on it) lends the lock to one of them at a time: with any enclosing owner
    accepted, both gathered tasks were inside it together."""
    log = _siblings(manager, through == "sync_to_async")
    assert log == ["first entered with 1 inside", "second refused"]
