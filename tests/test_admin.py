"""The admin Locks page, through Django's test client, against the real masters."""

from __future__ import annotations

import re

import pytest
import redis
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_redlock import get_lock_manager
from tests.conftest import eventually

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redlock_settings")]

LIST = "admin:django_redlock_lock_changelist"
RELEASE = "admin:django_redlock_lock_release"
DETAIL = "admin:django_redlock_lock_detail"


def staff(django_user_model, *perms):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="django_redlock"))
    client = Client()
    client.force_login(user)
    return client, user


def test_listed_in_admin_index(admin_client):
    response = admin_client.get(reverse("admin:index"))
    assert reverse(LIST) in response.content.decode()


def test_viewer_sees_locks_taken_through_the_engine(django_user_model):
    manager = get_lock_manager()
    manager.acquire("invoice-42", ttl=30, label="billing")
    client, _ = staff(django_user_model, "view_lock")
    response = client.get(reverse(LIST))
    page = response.content.decode()
    assert response.status_code == 200
    assert "invoice-42" in page and "billing" in page and "5/5" in page and "held by a quorum" in page
    assert "Force-release selected" not in page  # no release permission


def test_without_permission_403_and_anonymous_redirected(django_user_model):
    client, _ = staff(django_user_model)
    assert client.get(reverse(LIST)).status_code == 403
    assert client.post(reverse(RELEASE), {"resource": "x", "confirm": "yes"}).status_code == 403
    response = Client().get(reverse(LIST))
    assert response.status_code == 302 and reverse("admin:login") in response["Location"]


def test_viewer_cannot_release(django_user_model):
    get_lock_manager().acquire("keep-me", ttl=30)
    client, _ = staff(django_user_model, "view_lock")
    assert client.post(reverse(RELEASE), {"resource": "keep-me", "confirm": "yes"}).status_code == 403
    assert get_lock_manager().is_locked("keep-me")


def test_force_release_confirms_then_releases_and_logs(django_user_model, servers):
    manager = get_lock_manager()
    manager.acquire("stuck-1", ttl=30)
    manager.acquire("stuck-2", ttl=30)
    manager.acquire("other", ttl=30)
    client, user = staff(django_user_model, "view_lock", "release_lock")
    assert "Force-release selected" in client.get(reverse(LIST)).content.decode()
    confirm = client.post(reverse(RELEASE), {"resource": ["stuck-1", "stuck-2"]})
    assert confirm.status_code == 200 and "Are you sure?" in confirm.content.decode()
    assert manager.is_locked("stuck-1")  # nothing happens before confirmation
    done = client.post(reverse(RELEASE), {"resource": ["stuck-1", "stuck-2"], "confirm": "yes"})
    assert done.status_code == 302
    for server in servers:
        keys = sorted(k.decode() for k in redis.Redis.from_url(server.url).keys("redlock:lock:*"))
        assert keys == ["redlock:lock:other"]
    entries = LogEntry.objects.filter(user=user, action_flag=DELETION).order_by("object_repr")
    assert [e.object_repr for e in entries] == ["stuck-1", "stuck-2"]
    assert "5 of 5 nodes" in entries[0].change_message


def test_release_requires_post_with_csrf(django_user_model):
    get_lock_manager().acquire("csrf", ttl=30)
    user = django_user_model.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(reverse(RELEASE), {"resource": "csrf", "confirm": "yes"}).status_code == 403
    assert get_lock_manager().is_locked("csrf")
    page = client.get(reverse(RELEASE), {"resource": "csrf"})
    assert page.status_code == 200 and get_lock_manager().is_locked("csrf")  # GET only confirms


def test_node_down_still_renders(admin_client, servers):
    get_lock_manager().acquire("survivor", ttl=30)
    servers[1].kill()
    response = admin_client.get(reverse(LIST))
    page = response.content.decode()
    assert response.status_code == 200
    assert "survivor" in page and "4/5" in page and "<strong>down</strong>" in page


def test_search_sort_and_pagination(admin_client):
    manager = get_lock_manager()
    for i in range(120):
        manager.acquire(f"job-{i:03d}", ttl=30)
    manager.acquire("report-x", ttl=30)
    page = admin_client.get(reverse(LIST), {"q": "report"}).content.decode()
    assert "report-x" in page and "job-000" not in page
    first = admin_client.get(reverse(LIST)).content.decode()
    assert "job-000" in first and "Page 1 of 2" in first and "report-x" not in first
    second = admin_client.get(reverse(LIST), {"p": 2}).content.decode()
    assert "report-x" in second
    reverse_sorted = admin_client.get(reverse(LIST), {"o": "-resource"}).content.decode()
    assert reverse_sorted.index("report-x") < reverse_sorted.index("job-119")


def test_detail_per_node(admin_client, servers):
    get_lock_manager().acquire("detail-me", ttl=30, label="worker")
    servers[4].kill()
    page = admin_client.get(reverse(DETAIL), {"resource": "detail-me"}).content.decode()
    assert "Held on 4 of 5 nodes" in page and "worker" in page
    assert page.count("<tr>") >= 5


def test_passwords_never_on_the_page(admin_client, settings, servers):
    settings.REDLOCK_NODES = [u.replace("redis://", "redis://:Page-Secret-9@") for u in servers.urls]
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "Page-Secret-9" not in page


def test_restarted_nodes_shown_sitting_out(admin_client, settings):
    settings.REDLOCK = {**settings.REDLOCK, "RESTART_WINDOW": 3600}  # every test node is younger than an hour
    page = admin_client.get(reverse(LIST)).content.decode()
    assert page.count('class="up sits-out" title="') == 5  # each says why in its title
    assert page.count("s more</strong>") == 5


def waiting_cell(page, resource):
    row = re.search(rf">{re.escape(resource)}</a></th>.*?<td class=\"field-waiting\">(.*?)</td>", page, re.S)
    assert row, f"no row for {resource}"
    return re.sub(r"<[^>]+>", "", row.group(1)).strip()


def test_waiting_column_counts_calls_in_line(django_user_model, waiters):
    manager = get_lock_manager()
    held = manager.acquire("busy-report", ttl=30)
    manager.acquire("quiet-report", ttl=30)
    waiters.start(manager, "busy-report", 3, timeout=5)
    client, _ = staff(django_user_model, "view_lock")

    def page(**params):
        return client.get(reverse(LIST), params).content.decode()

    eventually(lambda: waiting_cell(page(), "busy-report") == "3")
    listing = page()
    assert "Waiting</a>" in listing and waiting_cell(listing, "quiet-report") == "0"
    busiest_first = page(o="-waiting")
    assert busiest_first.index("busy-report") < busiest_first.index("quiet-report")
    detail = client.get(reverse(DETAIL), {"resource": "busy-report"}).content.decode()
    assert "3 calls waiting in line." in detail and detail.count("<td>3</td>") == 5
    held.release()
    assert waiters.join() == ["acquired"] * 3
    assert "busy-report" not in page()  # no lock key left: the row is gone


def test_waiting_column_drops_when_waiters_give_up(admin_client, waiters):
    manager = get_lock_manager()
    held = manager.acquire("slow-report", ttl=30)
    waiters.start(manager, "slow-report", 2, timeout=0.8)
    waiters.start(manager, "slow-report", 1, timeout=8)

    def cell():
        return waiting_cell(admin_client.get(reverse(LIST)).content.decode(), "slow-report")

    eventually(lambda: cell() == "3")
    eventually(lambda: len(waiters.outcomes) == 2)
    assert cell() == "1"  # their places left with them (expiry alone would take up to 1.5 s)
    held.release()
    assert waiters.join()[2] == "acquired"


def test_passwords_never_on_the_page_when_some_nodes_refuse_them(admin_client, settings, servers):
    get_lock_manager().acquire("guarded", ttl=30)
    urls = servers.urls  # two nodes refuse the password (they have none): shown as down, without it
    settings.REDLOCK_NODES = [u.replace("redis://", "redis://:Page-Secret-4@") for u in urls[:2]] + urls[2:]
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "guarded" in page and "3/5" in page and page.count("<strong>down</strong>") == 2
    assert waiting_cell(page, "guarded") == "0" and "Page-Secret-4" not in page


def test_fewer_than_a_quorum_answering_shows_unknown_and_the_confirmation_warns(admin_client, settings, servers):
    settings.REDLOCK_NODES = servers.urls[:3]
    get_lock_manager().acquire("held-everywhere", ttl=30)
    servers[1].kill()
    servers[2].kill()
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "minority left-over" not in page and "unknown" in page
    banner = page.index('class="errornote redlock-unknown"')
    assert banner < page.index('id="result_list"')  # at the top, above the locks
    assert "Only 1 of 3 nodes answered" in page
    confirm = admin_client.post(reverse(RELEASE), {"resource": ["held-everywhere"]}).content.decode()
    assert "Are you sure?" in confirm and "Only 1 of 3 nodes answered" in confirm
    assert "may still be held by a quorum" in confirm


def test_the_confirmation_warns_of_a_lock_whose_state_is_unknown(admin_client, servers):
    manager = get_lock_manager()
    manager.acquire("clean", ttl=30)
    confirm = admin_client.get(reverse(RELEASE), {"resource": "clean"}).content.decode()
    assert "may still be held by a quorum" not in confirm  # every node answered: held, and it says so
    for server in servers[:2]:
        redis.Redis.from_url(server.url).delete("redlock:lock:clean")  # 3 of 5 nodes hold it
    servers[4].kill()  # 2 of the 4 that answer: the silent one could be the third
    confirm = admin_client.get(reverse(RELEASE), {"resource": "clean"}).content.decode()
    assert "may still be held by a quorum" in confirm
