"""A node password with a character a URL reserves ('#', '?', '/') shows up in no output.

Written unencoded, such a password cuts the URL short: what follows the character is read as
a fragment, a query or a path, and the password's head as a host or a port. Every output is
looked at: the checks, the error every lock call raises (and the exceptions chained to it,
which a traceback prints), the 500 logged for a locked view, the admin, the ``redlock``
command, and both cache backends behind ``cache:<alias>``.
"""

from __future__ import annotations

import logging
import traceback
from io import StringIO
from urllib.parse import quote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_redlock import get_async_lock_manager, get_lock_manager
from django_redlock.checks import Codes, check_settings
from django_redlock.core import LockManager
from django_redlock.testing import RedisServers

HEAD = "hunter2"
PASSWORDS = [f"{HEAD}#x", f"{HEAD}?x", f"{HEAD}/x", f"{HEAD}#x@y"]


def told(exc: BaseException) -> str:
    """Everything an exception can show: its traceback as printed, and every exception chained
    to it (cause and context, shown or not), their text and arguments."""
    shown = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        found = stack.pop()
        if found is None or any(found is s for s in seen):
            continue
        seen.append(found)
        shown += f"{found!s} {found!r} {found.args!r}"
        stack += [found.__cause__, found.__context__]
    return shown


@pytest.fixture(scope="module")
def protected():
    """Three nodes whose password has every character a URL reserves."""
    group = RedisServers(3, password=f"{HEAD}#?/@x").start()
    yield group
    group.stop()


def bad_urls(servers, password):
    return [f"redis://default:{password}@127.0.0.1:{s.port}/0" for s in servers]


@pytest.mark.parametrize("password", PASSWORDS)
def test_engine_refuses_the_url_naming_the_entry(servers, password):
    for url in (bad_urls(servers, password)[0], bad_urls(servers, password)[0].replace("default:", ":")):
        with pytest.raises(ValueError) as info:
            LockManager([servers.urls[0], url])
        assert "nodes[1]" in str(info.value) and "percent-encode" in str(info.value)
        assert HEAD not in told(info.value)


@pytest.mark.parametrize("password", PASSWORDS)
def test_settings_error_names_the_entry_in_checks_locks_logs_and_command(settings, servers, password, caplog, client):
    settings.REDLOCK_NODES = [*servers.urls[:2], bad_urls(servers, password)[2]]
    errors = [m for m in check_settings() if m.id == Codes.SETTINGS]
    assert len(errors) == 1 and "REDLOCK_NODES[2]" in errors[0].msg
    assert HEAD not in errors[0].msg + errors[0].hint

    for get in (get_lock_manager, get_async_lock_manager):
        with pytest.raises(ImproperlyConfigured) as info:
            get()
        assert "REDLOCK_NODES[2]" in str(info.value) and HEAD not in told(info.value)

    with caplog.at_level(logging.ERROR), pytest.raises(ImproperlyConfigured) as info:
        client.get("/pay/1/")  # a @redlock view: Django logs the 500 with its traceback
    assert caplog.records and HEAD not in caplog.text + told(info.value)

    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("redlock", "status", stdout=out, stderr=err)
    assert "REDLOCK_NODES[2]" in str(failed.value)
    assert HEAD not in told(failed.value) + out.getvalue() + err.getvalue()


def test_admin_page_shows_the_entry_not_the_password(admin_client, settings, servers):
    settings.REDLOCK_NODES = [*servers.urls[:2], bad_urls(servers, PASSWORDS[0])[2]]
    page = admin_client.get(reverse("admin:django_redlock_lock_changelist")).content.decode()
    assert "REDLOCK_NODES[2]" in page and HEAD not in page


BACKENDS = [
    ("django_redis.cache.RedisCache", "redis"),
    ("django_valkey.cache.ValkeyCache", "valkey"),
    ("django_valkey.async_cache.cache.AsyncValkeyCache", "valkey"),
    ("django.core.cache.backends.redis.RedisCache", "redis"),
]


@pytest.mark.parametrize("backend, scheme", BACKENDS)
@pytest.mark.parametrize("password", PASSWORDS)
def test_cache_alias_names_the_entry_and_alias(settings, servers, backend, scheme, password):
    pytest.importorskip(backend.split(".")[0])
    location = f"{scheme}://default:{password}@127.0.0.1:{servers[0].port}/0"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {"BACKEND": backend, "LOCATION": location},
    }
    settings.REDLOCK_NODES = ["cache:locks", *servers.urls[1:3]]
    errors = [m for m in check_settings() if m.id == Codes.SETTINGS]
    assert len(errors) == 1 and "REDLOCK_NODES[0]" in errors[0].msg and "'locks'" in errors[0].msg
    assert HEAD not in errors[0].msg + errors[0].hint
    with pytest.raises(ImproperlyConfigured) as info:
        get_lock_manager()
    assert "REDLOCK_NODES[0]" in str(info.value) and "'locks'" in str(info.value)
    assert HEAD not in told(info.value)


def test_percent_encoded_password_locks_and_shows_nowhere(settings, protected):
    password = f"{HEAD}#?/@x"
    settings.REDLOCK_NODES = [f"redis://default:{quote(password, safe='')}@127.0.0.1:{s.port}/0" for s in protected]
    settings.REDLOCK = {"RESTART_WINDOW": 0}
    assert not [m for m in check_settings() if m.id == Codes.SETTINGS]
    manager = get_lock_manager()
    with manager.lock("encoded") as lock:
        assert lock.locked()
    shown = repr(manager) + repr(manager.nodes) + repr(manager.node_list) + repr(manager.node_status())
    out = StringIO()
    call_command("redlock", "status", stdout=out)
    assert HEAD not in shown + out.getvalue()
