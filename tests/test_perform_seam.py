"""Every operation that talks to the nodes goes through its manager's one seam, ``_perform(effect)``:
each fan-out the drivers run was asked for by an effect given to ``_perform`` (the simulator replaces
``_perform`` per manager to run the real managers in its world)."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock.core import AsyncLockManager, LockManager, async_manager, steps, sync_manager


def _watch(monkeypatch, manager, module, name, is_async):
    """Count the driver's fan-outs and the Fan effects handed to ``manager._perform`` (background ones too)."""
    counts = {"fanouts": 0, "fans": 0, "kinds": set()}
    real_fanout, real_perform = getattr(module, name), manager._perform

    def note(effect):
        counts["kinds"].add("background" if getattr(effect, "background", False) else type(effect).__name__)
        counts["fans"] += type(effect) is steps.Fan

    if is_async:

        async def fanout(*args, **kwargs):
            counts["fanouts"] += 1
            return await real_fanout(*args, **kwargs)

        async def perform(effect):
            note(effect)
            return await real_perform(effect)

    else:

        def fanout(*args, **kwargs):
            counts["fanouts"] += 1
            return real_fanout(*args, **kwargs)

        def perform(effect):
            note(effect)
            return real_perform(effect)

    monkeypatch.setattr(module, name, fanout)
    manager._perform = perform  # the instance's own, as the simulator sets it
    return counts


def test_every_sync_operation_goes_through_perform(servers, monkeypatch):
    manager = LockManager(servers.urls, retry_count=0, restart_window=0)
    counts = _watch(monkeypatch, manager, sync_manager, "fanout", is_async=False)
    try:
        lock = manager.acquire("seam", ttl=5)
        lock.extend()
        assert lock.owned() is True
        assert lock.fencing_token > 0
        assert manager.is_locked("seam") is True
        assert manager.lock_record("seam") is not None
        assert [record.resource for record in manager.lock_listing().records] == ["seam"]
        handle = manager.adopt(lock.resources, lock.token)
        assert lock.release() is True
        assert handle.owned() is False
        manager.acquire("forced", ttl=5)
        assert manager.force_release("forced") == 5
        assert all(status.votes for status in manager.node_status())
        assert all(rtt is not None for rtt in manager.ping().values())
    finally:
        manager.close()
    assert counts["fanouts"] == counts["fans"] >= 15
    assert "Fan" in counts["kinds"]


@pytest.mark.asyncio
async def test_every_async_operation_goes_through_perform(servers, monkeypatch):
    manager = AsyncLockManager(servers.urls, retry_count=0, restart_window=0)
    counts = _watch(monkeypatch, manager, async_manager, "afanout", is_async=True)
    try:
        lock = await manager.acquire("seam", ttl=5)
        await lock.extend()
        assert await lock.owned() is True
        assert await lock.get_fencing_token() > 0
        assert await manager.is_locked("seam") is True
        assert await manager.lock_record("seam") is not None
        assert [record.resource for record in (await manager.lock_listing()).records] == ["seam"]
        handle = await manager.adopt(lock.resources, lock.token)
        assert await lock.release() is True
        assert await handle.owned() is False
        await manager.acquire("forced", ttl=5)
        assert await manager.force_release("forced") == 5
        assert all(status.votes for status in await manager.node_status())
        assert all(rtt is not None for rtt in (await manager.ping()).values())
        # A release whose caller is cancelled mid-round goes on as a background Fan, through _perform too.
        servers[0].pause()
        try:
            cancelled = await manager.acquire("cancelled", ttl=5)
            task = asyncio.ensure_future(cancelled.release())
            await asyncio.sleep(0)  # the task runs to its first suspension: its round written, replies awaited
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "background" in counts["kinds"]
        finally:
            servers[0].resume()
    finally:
        await manager.aclose()
    assert counts["fanouts"] == counts["fans"] >= 15
