"""A held lock's life on real servers, for the sync and asyncio engines: loss found at release,
owned(), dropped handles, on_lost, close; fork (sync), a hold shared by threads or tasks."""

from __future__ import annotations

import asyncio
import gc
import os
import select
import signal
import threading
import time
import traceback

import pytest
import redis

from django_redlock.core import AsyncLockManager, Hooks, LockManager, held, steps
from django_redlock.core import sync_manager as manager_module
from django_redlock.core.extender import Extender
from django_redlock.core.scripts import EXTEND
from django_redlock.exceptions import LockError, LockLost, QuorumUnavailable
from tests.conftest import eventually, eventually_async


#: A manager that never waits or retries, its nodes never sitting out.
FAST = {"ttl": 10.0, "retry_count": 0, "restart_window": 0}


def client(server):
    return redis.Redis.from_url(server.url, socket_timeout=2)


def nodes_with_key(servers, key):
    return sum(1 for s in servers if s.running and not s.paused and client(s).exists(key))


def nodes_with_value(servers, key, value):
    return sum(1 for s in servers if s.running and not s.paused and client(s).get(key) == value.encode())


def wait_child(pid, timeout):
    """Return the child's exit code, or None (and kill it) when it did not exit in time."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def child_work(manager, parent_lock, i):
    """In a forked child: use the manager, and leave the parent's lock alone."""
    manager.acquire(f"child-{i}", ttl=1.0).release()
    # A fresh child may stall (copy-on-write faults, a full collection): a ttl of 0.1 s left
    # 33 ms for the first extension, and CI once lost the lock in that time.
    with manager.lock(f"child-auto-{i}", ttl=0.5, auto_extend=True) as lock:
        time.sleep(0.7)  # past the ttl: only extension keeps it
        assert lock.locked() and lock.extensions >= 1
    assert not parent_lock.locked()
    assert parent_lock.release() is False  # the parent's lock is not the child's to release
    assert manager.is_locked(f"parent-{i}")


# -- fork while the extender is busy ------------------------------


def test_forked_children_start_with_a_clean_extender(manager, servers):
    outcomes, held = [], []
    for i in range(5):
        try:
            with manager.lock(f"parent-{i}", ttl=0.6, auto_extend=True) as lock:  # 0.1 s: fork stalls under load
                pid = os.fork()
                if pid == 0:  # the child: never return into pytest
                    code = 0
                    try:
                        child_work(manager, lock, i)
                    except AssertionError:
                        traceback.print_exc()
                        code = 1
                    except BaseException:  # noqa: BLE001
                        traceback.print_exc()
                        code = 2
                    os._exit(code)
                outcomes.append(wait_child(pid, 10.0))
                held.append(lock.locked())
        except LockLost:
            held.append(False)
    assert outcomes == [0] * 5, f"exit codes (None = hung): {outcomes}"
    assert held == [True] * 5, "a child released or disturbed the parent's lock"


# -- a lost lock is never released silently; owned() ---------------


def test_with_exit_raises_lock_lost_after_a_takeover(engine, servers):
    manager, other = engine.manager(servers.urls, **FAST), engine.manager(servers.urls, **FAST)
    with pytest.raises(LockLost, match="no longer stored"):
        with manager.lock("taken", ttl=5) as lock:
            assert other.force_release("taken") == 5
            thief = other.acquire("taken", ttl=5)
            eventually(lambda: nodes_with_value(servers, "redlock:lock:taken", thief.value) == 5)
    assert lock.lost and "force-released" in lock.lost_reason
    assert nodes_with_value(servers, "redlock:lock:taken", thief.value) == 5  # untouched
    assert thief.release() is True


def test_release_reports_a_loss_by_flag_and_return_value(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    lock = manager.acquire("flag", ttl=5)
    for server in servers[:3]:
        client(server).delete("redlock:lock:flag")
    assert lock.release() is False
    assert lock.lost and "3 of 5" in lock.lost_reason


def test_release_with_silent_nodes_is_not_a_loss(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    with manager.lock("silent", ttl=5) as lock:
        for server in servers[:3]:
            server.pause()
    assert lock.released and not lock.lost  # no answer is no proof; the keys just expire


def test_owned_asks_the_nodes(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    lock = manager.acquire("own", ttl=5)
    assert lock.owned() is True
    for server in servers[:2]:
        client(server).delete("redlock:lock:own")
    assert lock.owned() is True and not lock.lost
    client(servers[2]).set("redlock:lock:own", "someone else")
    assert lock.owned() is False
    assert lock.lost and "3 of 5" in lock.lost_reason
    released = manager.acquire("own2", ttl=5)
    released.release()
    assert released.owned() is False and not released.lost


def test_owned_raises_when_too_few_nodes_answer(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    lock = manager.acquire("few", ttl=5)
    servers[0].kill()
    servers[1].kill()
    assert lock.owned() is True
    servers[2].kill()
    with pytest.raises(QuorumUnavailable):
        lock.owned()
    assert not lock.lost


def test_keep_alive_notices_a_force_release_before_the_next_extension(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    lost = threading.Event()
    with pytest.raises(LockLost):
        with manager.lock("watched", ttl=3.0, auto_extend=True, on_lost=lambda lock: lost.set()) as lock:
            manager.force_release("watched")
            # The first extension is due after 2 s; a check tick must come well before.
            assert lost.wait(1.5), "the force-release was not noticed before the next extension"
            assert lock.lost and lock.extensions == 0


def test_acquire_with_auto_extend_keeps_the_lock_alive_until_it_is_released(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    lock = manager.acquire("kept", ttl=0.3, auto_extend=True)
    eventually(lambda: lock.extensions >= 3, seconds=5.0)  # past its ttl three times over
    assert lock.locked() and manager.is_locked("kept")
    assert lock.release() is True
    extensions = lock.extensions
    time.sleep(0.4)  # longer than the ttl: a watch left running would have extended by now
    assert lock.extensions == extensions and not manager.is_locked("kept")


def test_acquire_with_auto_extend_reports_a_loss_to_on_lost(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    fired = threading.Event()
    lock = manager.acquire("kept-lost", ttl=3.0, auto_extend=True, on_lost=lambda lost: fired.set())
    manager.force_release("kept-lost")
    assert fired.wait(2.0), "the loss was not reported"  # the watch looks before the first extension
    assert lock.lost and lock.release() is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"auto_extend": "yes"}, "auto_extend must be True or False"),
        ({"auto_extend": True, "max_hold": -1}, "max_hold must be > 0"),
        ({"auto_extend": True, "on_lost": "alert"}, "on_lost must be a callable"),
    ],
)
def test_acquire_checks_its_keep_alive_arguments_before_it_acquires(engine, servers, options, message):
    manager = engine.manager(servers.urls, **FAST)
    with pytest.raises(ValueError, match=message):
        manager.acquire("checked", **options)
    assert not manager.is_locked("checked")


# -- a dropped handle stops being extended -------------------------


def test_dropped_auto_extended_lock_expires(engine, servers):
    """A hold entered and then dropped (never left) stops being kept alive once nothing refers to it."""
    manager = engine.manager(servers.urls, **FAST)
    if engine.is_async:
        ctx = manager._target.lock("dropped", ttl=0.3, auto_extend=True)
        lock = manager._run(ctx.__aenter__())
    else:
        ctx = manager.lock("dropped", ttl=0.3, auto_extend=True)
        lock = ctx.__enter__()
    time.sleep(0.5)  # past the ttl: it is being extended
    # A quorum, not every node: one slow reply under load lets that node's copy lapse.
    assert lock.extensions >= 1 and nodes_with_key(servers, "redlock:lock:dropped") >= 3
    del lock, ctx
    gc.collect()
    deadline = time.monotonic() + 1.0  # the ttl, plus one tick and some slack
    while nodes_with_key(servers, "redlock:lock:dropped") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert nodes_with_key(servers, "redlock:lock:dropped") == 0, "a dropped lock is still being extended"


# -- on_lost exactly once, for real losses, by the deadline -------


def test_loss_found_by_a_manual_extend_calls_on_lost_once(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    calls = []
    fired = threading.Event()

    def on_lost(lock):
        calls.append(lock)
        fired.set()

    with pytest.raises(LockLost):
        with manager.lock("manual", ttl=5, auto_extend=True, on_lost=on_lost) as lock:
            manager.force_release("manual")
            with pytest.raises(LockLost):
                lock.extend()
            assert fired.wait(2.0), "on_lost was not called for a loss found outside the watchdog"
    assert calls == [lock]


def test_loss_found_by_owned_calls_on_lost_once(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    calls = []
    fired = threading.Event()
    with pytest.raises(LockLost):
        with manager.lock("by-owned", ttl=5, auto_extend=True, on_lost=lambda l: (calls.append(l), fired.set())) as lock:
            manager.force_release("by-owned")
            assert lock.owned() is False
            assert fired.wait(2.0)
    assert calls == [lock]


def test_extension_landing_after_a_clean_release_is_not_a_loss(manager, servers, monkeypatch):
    lost_hook = []

    class Record(Hooks):
        def lost(self, lock, reason):
            lost_hook.append(reason)

    mgr = LockManager(servers.urls, retry_count=0, restart_window=0, hooks=Record())
    extending, released, judged = threading.Event(), threading.Event(), threading.Event()
    real_fanout = manager_module.fanout

    def fanout(nodes, fan, timeout):
        if fan.script is EXTEND and not extending.is_set():
            extending.set()
            released.wait(5)  # the release runs while this EXTEND is "on the wire"
        return real_fanout(nodes, fan, timeout)

    monkeypatch.setattr(manager_module, "fanout", fanout)
    on_lost = []
    try:
        with mgr.lock("inflight", ttl=0.3, auto_extend=True, on_lost=on_lost.append) as lock:
            real_judge = held.judge_extend

            def judge(*args):
                try:
                    return real_judge(*args)
                finally:
                    judged.set()

            monkeypatch.setattr(held, "judge_extend", judge)
            assert extending.wait(2.0)
        released.set()
        assert judged.wait(2.0)
        assert not lock.lost and lock.release() is False
        assert on_lost == [] and lost_hook == []
    finally:
        released.set()
        mgr.close()


async def test_async_extension_landing_after_a_clean_release_is_not_a_loss(servers):
    lost_hook = []

    class Record(Hooks):
        def lost(self, lock, reason):
            lost_hook.append(reason)

    mgr = AsyncLockManager(servers.urls, retry_count=0, restart_window=0, hooks=Record())
    extending, released, judged = asyncio.Event(), asyncio.Event(), asyncio.Event()
    real_perform = mgr._perform

    async def perform(effect):
        if isinstance(effect, steps.Fan) and effect.script is EXTEND and not extending.is_set():
            extending.set()
            await released.wait()  # the release runs while this EXTEND is "on the wire"
            try:
                return await real_perform(effect)
            finally:
                asyncio.get_running_loop().call_soon(judged.set)
        return await real_perform(effect)

    mgr._perform = perform
    on_lost = []
    try:
        ctx = mgr.lock("inflight", ttl=0.3, auto_extend=True, on_lost=on_lost.append)
        lock = await ctx.__aenter__()
        await asyncio.wait_for(extending.wait(), 2.0)
        assert await lock.release() is True  # the keep-alive task is still waiting in the fan-out
        released.set()
        await asyncio.wait_for(judged.wait(), 2.0)
        await ctx.__aexit__(None, None, None)
        assert not lock.lost and on_lost == [] and lost_hook == []
    finally:
        released.set()
        await mgr.aclose()


def test_on_lost_fires_by_the_validity_deadline_when_extensions_fail(engine, servers):
    # A node timeout longer than a third of the ttl: the extension attempt outlasts the validity.
    mgr = engine.manager(servers.urls, retry_count=0, restart_window=0, node_timeout=0.4)
    fired_at = []
    fired = threading.Event()

    def on_lost(lock):
        fired_at.append(time.monotonic())
        fired.set()

    try:
        with pytest.raises(LockLost):
            with mgr.lock("deadline", ttl=0.9, auto_extend=True, on_lost=on_lost) as lock:
                deadline = time.monotonic() + lock.validity
                for server in servers[:3]:
                    server.pause()
                assert fired.wait(5.0)
        assert len(fired_at) == 1
        late = fired_at[0] - deadline
        assert -0.02 <= late <= 0.05, f"on_lost fired {late * 1000:.0f} ms after the validity ended"
        assert lock.lost_reason
    finally:
        for server in servers[:3]:
            server.resume()


def test_transient_extension_failure_is_not_a_loss(engine, servers):
    manager = engine.manager(servers.urls, **FAST)
    on_lost = []
    with manager.lock("blip", ttl=0.6, auto_extend=True, on_lost=on_lost.append) as lock:
        for server in servers[:3]:
            server.pause()
        time.sleep(0.5)  # the extension due at 0.4 s fails
        for server in servers[:3]:
            server.resume()
        time.sleep(0.8)  # a retry within the validity succeeds; then it keeps being extended
        assert lock.locked() and lock.extensions >= 1
    assert on_lost == [] and not lock.lost


def test_forked_copy_of_a_lock_is_not_held(manager, servers):
    lock = manager.acquire("copy", ttl=5)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            assert not lock.locked() and lock.owned() is False
            assert lock.release() is False
            try:
                lock.extend()
                code = 3
            except LockError:
                pass
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    assert wait_child(pid, 10.0) == 0
    assert lock.owned() is True and lock.release() is True


def test_close_reads_the_replies_a_release_left_coming(engine, servers):
    """release() returns once a quorum deleted the key; close() (aclose()) then reads the last
    nodes' replies (a socket closed with unread bytes is reset) and settles what they owed."""
    from tests.proxy import Proxy

    with Proxy(servers[3].port) as p3, Proxy(servers[4].port) as p4:
        mgr = engine.manager([s.url for s in servers[:3]] + [p3.url, p4.url], ttl=5, retry_count=0, restart_window=0)
        lock = mgr.acquire("closing", blocking=False)
        for proxy in (p3, p4):
            proxy.hold_replies()
        assert lock.release() is True  # three nodes confirmed; two replies are held
        assert all(books.ledger.debts for books in engine.books_of(mgr)[3:])  # not confirmed yet
        for proxy in (p3, p4):
            proxy.pass_replies()
            proxy.flush_replies()  # on their way now
        mgr.close()
        assert not any(books.ledger.debts for books in engine.books_of(mgr))
        assert not any(books.parked or books.idle for books in engine.books_of(mgr))


def test_one_hold_shared_by_threads_leaves_each_callers_own_lock(mgr):
    """``guard = manager.lock(...)`` used by several threads, as one would a ``threading.Lock``: a
    holder whose lock expired in its block reports its own loss at its exit and leaves alone the
    lock the next holder took through the same hold."""
    guard = mgr.lock("shared-hold", ttl=0.3)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def first() -> None:
        try:
            with guard as lock:
                first_in.set()
                eventually(lambda: lock.validity == 0)
                assert second_in.wait(10)  # the next holder took the lock meanwhile
            seen["first"] = "left without a loss"
        except LockLost as exc:
            seen["first"] = exc
        finally:
            first_out.set()

    def second() -> None:
        assert first_in.wait(10)
        with guard as lock:
            second_in.set()
            assert first_out.wait(10)
            seen["second held"] = lock.locked() and mgr.is_locked("shared-hold")
        seen["second"] = "clean"

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert isinstance(seen["first"], LockLost), seen
    assert seen["second held"] is True
    assert seen["second"] == "clean"
    assert not mgr.is_locked("shared-hold")


async def test_one_async_hold_shared_by_tasks_leaves_each_callers_own_lock(servers):
    m = AsyncLockManager(servers.urls, restart_window=0, retry_delay=0.05)
    guard = m.lock("shared-hold-async", ttl=0.3)
    second_in, first_out = asyncio.Event(), asyncio.Event()
    seen: dict[str, object] = {}

    async def first() -> None:
        try:
            async with guard as lock:
                await eventually_async(lambda: lock.validity == 0)
                second = asyncio.ensure_future(second_holder())
                await asyncio.wait_for(second_in.wait(), 10)
            seen["first"] = "left without a loss"
        except LockLost as exc:
            seen["first"] = exc
        finally:
            first_out.set()
        await second

    async def second_holder() -> None:
        async with guard as lock:
            second_in.set()
            await asyncio.wait_for(first_out.wait(), 10)
            seen["second held"] = lock.locked() and await m.is_locked("shared-hold-async")
        seen["second"] = "clean"

    try:
        await first()
    finally:
        await m.aclose()
    assert isinstance(seen["first"], LockLost), seen
    assert seen["second held"] is True
    assert seen["second"] == "clean"


def test_a_hold_whose_keep_alive_cannot_start_leaves_no_lock_behind(manager):
    """The watchdog thread cannot start (a process out of threads; interpreter shutdown): the
    error goes to the caller and the lock just acquired is released, not left for its ttl."""

    def no_thread(run: object) -> object:
        raise RuntimeError("can't start new thread")

    manager._extender_instance = Extender(start=no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        with manager.lock("no-watchdog", auto_extend=True):
            pytest.fail("the with block ran without its keep-alive")
    assert not manager.is_locked("no-watchdog")
    manager.acquire("no-watchdog", blocking=False).release()


async def test_an_async_hold_whose_keep_alive_cannot_start_leaves_no_lock_behind(servers, monkeypatch):
    """The keep-alive task cannot be made (a task factory that refuses, a closing loop): the error goes
    to the caller and the lock just acquired is released, as by the sync hold."""
    from django_redlock.core import async_manager

    def no_task(*args: object) -> object:
        raise RuntimeError("no keep-alive task")

    monkeypatch.setattr(async_manager, "_keep_alive", no_task)
    mgr = AsyncLockManager(servers.urls, retry_count=0, restart_window=0)
    try:
        with pytest.raises(RuntimeError, match="no keep-alive task"):
            async with mgr.lock("no-keep-alive", auto_extend=True):
                pytest.fail("the async with block ran without its keep-alive")
        assert not await mgr.is_locked("no-keep-alive")
        await (await mgr.acquire("no-keep-alive", blocking=False)).release()
    finally:
        await mgr.aclose()


def test_a_slow_on_lost_does_not_stop_the_watchdog_keeping_other_locks_alive(manager):
    """on_lost may take a while (an alert sent over the network): meanwhile the watchdog goes on
    extending every other lock of the process, which would otherwise all expire."""
    reporting, done = threading.Event(), threading.Event()

    def slow_alert(lock: object) -> None:
        reporting.set()
        done.wait(10)

    first = manager.lock("slow-report", ttl=0.6, auto_extend=True, on_lost=slow_alert)
    lost = first.__enter__()
    try:
        with manager.lock("kept-alive", ttl=0.6, auto_extend=True) as other:
            manager.force_release("slow-report")
            assert reporting.wait(5)
            start = other.extensions
            eventually(lambda: other.extensions >= start + 3, seconds=3.0)  # 0.6 s ttl: about 1 s
            assert not other.lost
    finally:
        done.set()
        assert isinstance(first.leave(), LockLost) and lost.lost
