"""A refused acquire names who holds the lock (host:pid and label, escaped, and the digest of its
token) when a quorum of the nodes store that holder; never the token. Sync and asyncio engines, on
real servers."""

from __future__ import annotations

import pytest
import redis

from django_redlock.core.records import Holder, digest_of
from django_redlock.exceptions import LockNotAcquired

FAST = {"ttl": 10.0, "retry_count": 0, "node_timeout": 0.5, "restart_window": 0}


def plant(servers, resource, holder, nodes):
    for n in nodes:
        with redis.Redis.from_url(servers[n].url) as client:
            client.set(f"redlock:lock:{resource}", holder.encode(), px=60_000)


def refused(manager, resource, **options):
    with pytest.raises(LockNotAcquired) as info:
        manager.acquire(resource, blocking=False, **options)
    return info.value


def test_the_holder_a_quorum_stores_is_named(servers, engine):
    holder_side = engine.manager(servers.urls, label="nightly-import", **FAST)
    lock = holder_side.acquire("imports")
    error = refused(engine.manager(servers.urls, **FAST), "imports")
    text = str(error)
    assert error.holder == str(lock.holder) and error.holder.endswith(":" + str(lock.holder.pid) + " (nightly-import)")
    assert text.startswith("Could not lock 'imports': 0 of 5 nodes agreed, 3 needed (")
    assert f"It is held by {error.holder} on 5 of 5 nodes (holder digest {digest_of(lock.token)})." in text
    assert lock.token[:10] not in text + repr(error) and 9.0 < error.retry_after <= 10.0


def test_a_holder_on_fewer_than_a_quorum_is_not_named(servers, manager):
    """Two holders on two nodes each, none on a quorum: nobody is named (each is only on a minority)."""
    plant(servers, "split", Holder("one", "web-1", 1, "a"), [0, 1])
    plant(servers, "split", Holder("two", "web-2", 2, "b"), [2, 3])
    error = refused(manager, "split")
    assert error.granted == 1 and error.holder is None
    assert "held by another holder" in str(error) and "It is held by" not in str(error)
    assert "web-" not in str(error)


def test_what_others_wrote_is_named_escaped(servers, manager):
    """Anyone who can write under the prefix chooses the host and label: shown escaped, one line."""
    forged = Holder("x" * 40, "evil\x1b]0;pwned\x07", 7, "row\nrefund-77 held by a quorum")
    plant(servers, "hostile", forged, range(5))
    error = refused(manager, "hostile")
    text = str(error)
    assert text.isprintable() and error.holder.isprintable()
    assert "evil\\x1b]0;pwned\\x07:7 (row\\nrefund-77 held by a quorum)" in text
    assert "x" * 20 not in text and digest_of("x" * 40) in text


def test_several_resources_name_each_held_one(servers, manager):
    plant(servers, "pay-1", Holder("t1", "web-1", 11, "billing"), range(5))
    plant(servers, "pay-3", Holder("t3", "web-3", 33, None), range(1, 4))  # 3 of 5: a quorum
    plant(servers, "pay-4", Holder("t4", "web-4", 44, None), range(2))  # 2 of 5: not named
    error = refused(manager, ["pay-1", "pay-2", "pay-3", "pay-4"])
    assert str(error).endswith(
        f"Held: 'pay-1' by web-1:11 (billing) on 5 of 5 nodes (holder digest {digest_of('t1')}); "
        f"'pay-3' by web-3:33 on 3 of 5 nodes (holder digest {digest_of('t3')})."
    )
    assert error.holder == "web-1:11 (billing)" and "web-4" not in str(error)


def test_a_call_that_waited_names_the_holder_too(servers, mgr):
    """A blocking call that gives up reads the holder in the same round trip as the ttl left."""
    plant(servers, "queue", Holder("tq", "worker-9", 99, "drain"), range(5))
    with pytest.raises(LockNotAcquired) as info:
        mgr.acquire("queue", timeout=0.2)
    assert info.value.holder == "worker-9:99 (drain)" and "after" in str(info.value)
    assert 50 < info.value.retry_after <= 60


def test_the_callers_own_value_is_not_named():
    """Where the caller's last attempt is still stored (its release did not land), it is not "another holder"."""
    from django_redlock.core.base import holders_of

    own, other = Holder("mine", "here", 1).encode(), Holder("theirs", "there", 2).encode()
    replies = [[own.encode(), 900, []]] * 3 + [[other.encode(), 900, []]] * 2
    assert holders_of(["r"], replies, 3, own) == []
    named = holders_of(["r"], [[other.encode(), 900, []]] * 3 + [[None, -2, []], Exception("down")], 3, own)
    assert [(resource, str(holder), nodes) for resource, holder, nodes in named] == [("r", "there:2", 3)]
