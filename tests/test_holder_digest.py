"""A holder's token authorizes release, extension and ``adopt()``: no screen, log line, error, signal
or metric shows it (nor the stored value that holds it). The digest of the token names the holder
instead, the same everywhere. On real servers, through the command, the admin and the logs."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from io import StringIO

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from prometheus_client import CollectorRegistry, generate_latest

from django_redlock import get_lock_manager, signals
from django_redlock.core.records import DIGEST_DIGITS, Holder, digest_of
from django_redlock.exceptions import LockLost, LockNotAcquired
from django_redlock.metrics import PrometheusHooks

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redlock_settings")]


def run(*args):
    out, err = StringIO(), StringIO()
    try:
        call_command("redlock", *args, stdout=out, stderr=err)
    except CommandError as exc:
        err.write(str(exc))
    return out.getvalue() + err.getvalue()


def test_the_digest_is_the_tokens_sha256_prefix():
    holder = Holder("0123abcd" * 5, "web-1", 42, "billing", 1.5)
    assert holder.digest == digest_of(holder.token) == hashlib.sha256(b"0123abcd" * 5).hexdigest()[:12]
    assert re.fullmatch(r"[0-9a-f]{%d}" % DIGEST_DIGITS, holder.digest)
    assert Holder.decode(holder.encode()).digest == holder.digest  # as read back from the nodes
    assert digest_of("\ud800odd") == digest_of("\ud800odd")  # a lone surrogate (from JSON) still has one
    assert holder.token not in repr(holder) and holder.digest in repr(holder)


def test_no_output_shows_the_token(servers, django_user_model, caplog, redlock_settings):
    registry = CollectorRegistry()
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "HOOKS": [PrometheusHooks(registry)], "RETRY_COUNT": 0}
    sent = []

    def receiver(sender, **kwargs):
        sent.append(repr(kwargs) + " ".join(map(str, kwargs.values())))

    hooked = [signals.lock_acquired, signals.lock_extended, signals.lock_lost, signals.lock_not_acquired]
    for signal in hooked:
        signal.connect(receiver)
    outputs: dict[str, str] = {}
    try:
        with caplog.at_level(logging.DEBUG, logger="django_redlock"):
            manager = get_lock_manager()
            lock = manager.acquire("invoice-9", ttl=30, label="billing")
            lock.extend()
            outputs["list"] = run("list")
            outputs["list --json"] = run("list", "--json")
            with pytest.raises(LockNotAcquired) as contended:
                manager.acquire("invoice-9", blocking=False)
            outputs["error"] = f"{contended.value} {contended.value!r} {contended.value.holder}"
            record = manager.lock_record("invoice-9")
            outputs["record"] = f"{record!r} {record.holder!r} {record.entries!r} {lock!r}"

            user = django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
            client = Client()
            client.force_login(user)
            outputs["admin list"] = client.get(reverse("admin:django_redlock_lock_changelist")).content.decode()
            detail = reverse("admin:django_redlock_lock_detail") + "?resource=invoice-9"
            outputs["admin detail"] = client.get(detail).content.decode()
            release = reverse("admin:django_redlock_lock_release") + "?resource=invoice-9"
            outputs["admin confirm"] = client.get(release).content.decode()
            bulk = {"action": "force_release_selected", "index": "0", "_selected_action": ["invoice-9"]}
            outputs["admin bulk confirm"] = client.post(reverse("admin:django_redlock_lock_changelist"), bulk).content.decode()

            for server in servers:  # taken away behind its back: the next extension finds it lost
                with redis.Redis.from_url(server.url) as node:
                    node.delete("redlock:lock:invoice-9")
            with pytest.raises(LockLost) as lost:
                lock.extend()
            outputs["lost"] = f"{lost.value} {lost.value!r} {lock.lost_reason}"
            lock.release()
        outputs["log"] = caplog.text
        outputs["signals"] = "\n".join(sent)
        outputs["metrics"] = generate_latest(registry).decode()
    finally:
        for signal in hooked:
            signal.disconnect(receiver)

    token, digest = lock.token, lock.holder.digest
    assert digest == digest_of(token) and lock.value.count(token) == 1
    for name, text in outputs.items():
        assert text, name
        assert token[:10] not in text, f"{name} shows the token"
    for name in ("list", "list --json", "error", "record", "admin list", "admin detail", "log"):
        assert digest in outputs[name], f"{name} lacks the digest"
    assert json.loads(outputs["list --json"])[0]["holder"]["digest"] == digest
    named = contended.value.holder
    assert named == str(lock.holder) and named.endswith("(billing)")
    assert f"It is held by {named} on 5 of 5 nodes (holder digest {digest})." in str(contended.value)
    assert f'<code class="redlock-digest">{digest}</code>' in outputs["admin detail"]
    # The log line of each event carries the digest: one holder can be followed through them.
    for event in ("Acquired lock 'invoice-9'", "Extended lock 'invoice-9'", "Lock 'invoice-9' was lost"):
        assert any(event in line and digest in line for line in outputs["log"].splitlines()), event


def test_holders_written_by_others_get_a_digest_too(servers):
    """A value that is not one of ours (a bare token) is named by the digest of the whole value."""
    for server in servers:
        with redis.Redis.from_url(server.url) as node:
            node.set("redlock:lock:foreign", "secret-value-from-elsewhere", px=60_000)
    text, data = run("list"), run("list", "--json")
    digest = digest_of("secret-value-from-elsewhere")
    assert "secret-value" not in text + data and digest in text.splitlines()[1].split()
    assert [e["holder"]["digest"] for e in json.loads(data)[0]["entries"]] == [digest] * 5
