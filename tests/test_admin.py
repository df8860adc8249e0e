"""The admin Locks page, through Django's test client, against the real masters."""

from __future__ import annotations

import re
import warnings

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
    assert "invoice-42" in page and "billing" in page and "5 of 5" in page and "held by a quorum" in page
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
    assert "survivor" in page and "4 of 5" in page and "<strong>down</strong>" in page


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


def states_shown(page):
    """Each row's resource and the state its State cell shows."""
    cell = r'<td class="field-state"><span class="redlock-state \w+">([^<]*)</span>'
    # Within one row (the admin's nav sidebar has rows with a link in a <th> too).
    return dict(re.findall(r">([^<>]+)</a></th>(?:(?!</tr>).)*?" + cell, page, re.S))


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
    assert "guarded" in page and "3 of 5" in page and page.count("<strong>down</strong>") == 2
    assert waiting_cell(page, "guarded") == "0" and "Page-Secret-4" not in page


def test_fewer_than_a_quorum_answering_shows_unknown_and_the_confirmation_warns(admin_client, settings, servers):
    settings.REDLOCK_NODES = servers.urls[:3]
    get_lock_manager().acquire("held-everywhere", ttl=30)
    servers[1].kill()
    servers[2].kill()
    page = admin_client.get(reverse(LIST)).content.decode()
    assert states_shown(page) == {"held-everywhere": "unknown: may be held"}  # not a minority left-over
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


# --- Filters by state, bulk force-release through the actions dropdown, auto-refresh -------------------------

ACTION = "force_release_selected"


def plant(servers, resources, nodes, token="left-over", ttl_ms=60_000):
    """Lock keys written straight to some nodes: a minority left-over when fewer than a quorum hold them."""
    from django_redlock.core.records import Holder

    for n in nodes:
        with redis.Redis.from_url(servers[n].url) as client:
            pipe = client.pipeline(transaction=False)
            for resource in resources:
                pipe.set(f"redlock:lock:{resource}", Holder(token, "gone-host", 7).encode(), px=ttl_ms)
            pipe.execute()


def links(page):
    """Every href on the page, unescaped."""
    return [h.replace("&amp;", "&") for h in re.findall(r'href="([^"]*)"', page)]


def test_state_filter_lists_only_that_state_in_the_admin_sidebar(admin_client, servers):
    manager = get_lock_manager()
    manager.acquire("held-a", ttl=30)
    manager.acquire("held-b", ttl=30)
    plant(servers, ["left-x", "left-y"], nodes=[0, 1])
    plant(servers, ["split-z"], nodes=[0, 1], token="one")
    plant(servers, ["split-z"], nodes=[2, 3], token="other")
    everything = admin_client.get(reverse(LIST)).content.decode()
    assert set(states_shown(everything)) == {"held-a", "held-b", "left-x", "left-y", "split-z"}
    assert '<nav id="changelist-filter" aria-labelledby="changelist-filter-header">' in everything
    assert '<li class="selected">\n          <a href="?" aria-current="true">All</a>' in everything
    assert "Clear all filters" not in everything

    page = admin_client.get(reverse(LIST), {"state": "minority"}).content.decode()
    assert states_shown(page) == {"left-x": "minority left-over", "left-y": "minority left-over"}
    assert '<a href="?state=minority" aria-current="true">minority left-over</a>' in page
    assert "2 locks ·" in page and "Clear all filters" in page
    assert states_shown(admin_client.get(reverse(LIST), {"state": "held"}).content.decode()) == {
        "held-a": "held by a quorum",
        "held-b": "held by a quorum",
    }
    assert list(states_shown(admin_client.get(reverse(LIST), {"state": "split"}).content.decode())) == ["split-z"]
    empty = admin_client.get(reverse(LIST), {"state": "unknown"}).content.decode()
    assert states_shown(empty) == {} and "No live locks in this state." in empty


def test_the_filter_survives_sorting_searching_and_paging(admin_client, servers):
    plant(servers, [f"left-{i:03d}" for i in range(130)], nodes=[0, 1])
    plant(servers, [f"held-{i:03d}" for i in range(3)], nodes=range(5), token="held")
    query = {"state": "minority", "o": "-resource", "refresh": "10"}
    first = admin_client.get(reverse(LIST), query).content.decode()
    assert list(states_shown(first)) == [f"left-{i:03d}" for i in range(129, 29, -1)]
    assert "Page 1 of 2" in first and "130 locks ·" in first
    hrefs = links(first)
    assert "?o=-resource&state=minority&refresh=10&p=2" in hrefs  # next page keeps it all
    assert "?state=minority&refresh=10" in hrefs  # the sorted column toggles, on the first page
    assert "?o=holder&state=minority&refresh=10" in hrefs  # another column
    assert "?o=-resource&refresh=10" in hrefs and "?o=-resource&state=held&refresh=10" in hrefs  # the sidebar
    assert '<input type="hidden" name="state" value="minority">' in first  # the search form keeps it too
    second = admin_client.get(reverse(LIST), {**query, "p": "2"}).content.decode()
    assert list(states_shown(second)) == [f"left-{i:03d}" for i in range(29, -1, -1)]
    searched = admin_client.get(reverse(LIST), {"state": "minority", "q": "left-12"}).content.decode()
    assert list(states_shown(searched)) == [f"left-12{i}" for i in range(10)]


def test_an_unknown_state_or_refresh_in_the_address_says_what_was_expected(admin_client):
    get_lock_manager().acquire("still-listed", ttl=30)
    page = admin_client.get(reverse(LIST), {"state": "stuck", "refresh": "7"}).content.decode()
    assert "Unknown state &#x27;stuck&#x27; in the address: expected one of held, minority, split, unknown." in page
    assert "Unknown auto-refresh &#x27;7&#x27; in the address: expected one of 5, 10, 30 (seconds)." in page
    assert "still-listed" in states_shown(page) and 'data-refresh-seconds="0"' in page


@pytest.mark.parametrize("refresh", ["²", "①", "٥", "05", " 5", "-5"])
def test_a_refresh_that_is_not_one_of_the_intervals_is_named_not_a_500(admin_client, refresh):
    response = admin_client.get(reverse(LIST), {"refresh": refresh})
    assert response.status_code == 200
    assert "Unknown auto-refresh" in response.content.decode() and 'data-refresh-seconds="0"' in response.content.decode()


def action_post(client, resources, path=None, **extra):
    return client.post(path or reverse(LIST), {"action": ACTION, "index": "0", "_selected_action": resources, **extra})


def test_bulk_force_release_through_the_actions_dropdown(django_user_model, servers):
    manager = get_lock_manager()
    for name in ("stuck-1", "stuck-2", "keep"):
        manager.acquire(name, ttl=30)
    client, user = staff(django_user_model, "view_lock", "release_lock")
    page = client.get(reverse(LIST)).content.decode()
    assert '<select name="action" required>' in page
    assert '<option value="force_release_selected">Force-release selected locks</option>' in page
    assert "delete_selected" not in page  # the site-wide actions need table rows
    assert page.count('name="_selected_action"') == 3 and 'id="action-toggle"' in page
    assert 'name="index" value="0"' in page and "0 of 3 selected" in page

    filtered = reverse(LIST) + "?state=held&o=-resource"
    confirm = action_post(client, ["stuck-1", "stuck-2"], path=filtered)
    text = confirm.content.decode()
    assert confirm.status_code == 200 and "Are you sure?" in text
    assert "<li>stuck-1 — held by a quorum</li><li>stuck-2 — held by a quorum</li>" in text
    assert "may still be held by a quorum" not in text  # every node answered
    assert '<input type="hidden" name="post" value="yes">' in text
    assert '<input type="hidden" name="action" value="force_release_selected">' in text
    assert 'data-refresh' not in text and "locks.js" not in text  # a confirmation never refreshes itself
    assert manager.is_locked("stuck-1") and manager.is_locked("stuck-2")  # nothing happens before confirmation

    done = action_post(client, ["stuck-1", "stuck-2"], path=filtered, post="yes")
    assert done.status_code == 302 and done["Location"] == filtered  # back to the same filtered page
    for server in servers:
        keys = sorted(k.decode() for k in redis.Redis.from_url(server.url).keys("redlock:lock:*"))
        assert keys == ["redlock:lock:keep"]
    entries = LogEntry.objects.filter(user=user, action_flag=DELETION).order_by("object_repr")
    assert [(e.object_repr, e.change_message) for e in entries] == [
        ("stuck-1", "Force-released on 5 of 5 nodes."),
        ("stuck-2", "Force-released on 5 of 5 nodes."),
    ]
    after = client.get(done["Location"]).content.decode()
    assert '<div id="redlock-messages" role="status">' in after
    assert "Released 2 locks: stuck-1 (on 5 of 5 nodes), stuck-2 (on 5 of 5 nodes)." in after


def test_the_outcome_of_each_lock_is_told(django_user_model, servers):
    manager = get_lock_manager()
    manager.acquire("everywhere", ttl=30)
    manager.acquire("quorum-only", ttl=30)
    plant(servers, ["left-over"], nodes=[0, 1])
    client, _ = staff(django_user_model, "view_lock", "release_lock")
    assert action_post(client, ["everywhere", "already-gone", "left-over"]).status_code == 200
    done = action_post(client, ["everywhere", "already-gone", "left-over"], post="yes")
    page = client.get(done["Location"]).content.decode()
    assert "Released 2 locks: everywhere (on 5 of 5 nodes), left-over (on 2 of 5 nodes)." in page
    assert "No node held already-gone any more: nothing to release." in page
    plant(servers, ["odd\x07name"], nodes=range(5))  # a key written by something else: no lock has such a name
    done = action_post(client, ["odd\x07name"], post="yes")
    page = client.get(done["Location"]).content.decode()
    assert "Could not release odd\x07name: resource must not contain control characters." in page
    assert 'class="error"' in page and get_lock_manager().lock_record("odd\x07name") is not None
    servers[4].kill()
    done = action_post(client, ["quorum-only"], post="yes")
    page = client.get(done["Location"]).content.decode()
    assert f"Released quorum-only on 4 of 5 nodes; {manager.nodes[4]} did not answer" in page
    assert 'class="warning"' in page


def test_without_the_release_permission_no_action_and_a_forged_post_is_refused(django_user_model):
    get_lock_manager().acquire("keep-me", ttl=30)
    client, _ = staff(django_user_model, "view_lock")
    page = client.get(reverse(LIST)).content.decode()
    assert "keep-me" in states_shown(page)
    assert 'name="action"' not in page and "_selected_action" not in page and "action-toggle" not in page
    for forged in (
        {"action": ACTION, "index": "0", "_selected_action": ["keep-me"]},
        {"action": ACTION, "post": "yes", "_selected_action": ["keep-me"]},
        {"action": "delete_selected", "post": "yes", "_selected_action": ["keep-me"]},
        {"resource": "keep-me", "confirm": "yes"},
    ):
        assert client.post(reverse(LIST), forged).status_code == 403
    assert get_lock_manager().is_locked("keep-me")
    assert not LogEntry.objects.exists()


def test_no_lock_or_no_action_selected_changes_nothing(django_user_model):
    get_lock_manager().acquire("untouched", ttl=30)
    client, _ = staff(django_user_model, "view_lock", "release_lock")
    response = client.post(reverse(LIST) + "?state=held", {"action": ACTION, "index": "0"}, follow=True)
    assert response.redirect_chain == [(reverse(LIST) + "?state=held", 302)]
    assert "Items must be selected in order to perform actions on them." in response.content.decode()
    response = client.post(reverse(LIST), {"action": "", "index": "0", "_selected_action": ["untouched"]}, follow=True)
    assert "No action selected." in response.content.decode()
    assert get_lock_manager().is_locked("untouched") and not LogEntry.objects.exists()


def test_bulk_action_needs_the_csrf_token(django_user_model):
    get_lock_manager().acquire("csrf-bulk", ttl=30)
    user = django_user_model.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert action_post(client, ["csrf-bulk"], post="yes").status_code == 403
    assert get_lock_manager().is_locked("csrf-bulk")
    page = client.get(reverse(LIST)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    confirm = action_post(client, ["csrf-bulk"], csrfmiddlewaretoken=token)
    assert confirm.status_code == 200 and get_lock_manager().is_locked("csrf-bulk")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode()).group(1)
    assert action_post(client, ["csrf-bulk"], post="yes", csrfmiddlewaretoken=token).status_code == 302
    assert not get_lock_manager().is_locked("csrf-bulk")


def test_the_bulk_confirmation_warns_when_the_listing_is_unknown(admin_client, settings, servers):
    settings.REDLOCK_NODES = servers.urls[:3]
    get_lock_manager().acquire("maybe-held", ttl=30)
    servers[1].kill()
    servers[2].kill()
    page = admin_client.get(reverse(LIST), {"state": "unknown"}).content.decode()
    assert states_shown(page) == {"maybe-held": "unknown: may be held"}
    confirm = action_post(admin_client, ["maybe-held"], path=reverse(LIST) + "?state=unknown").content.decode()
    assert "Only 1 of 3 nodes answered, 2 needed." in confirm and "may still be held by a quorum" in confirm
    assert '<p class="errornote" role="alert">' in confirm and "maybe-held — unknown: may be held" in confirm


def test_auto_refresh_is_off_by_default_and_kept_in_the_address(admin_client):
    get_lock_manager().acquire("watched", ttl=30)
    off = admin_client.get(reverse(LIST)).content.decode()
    assert '<label for="redlock-refresh-interval">Auto-refresh</label>' in off
    assert '<option value="" selected>off</option>' in off and 'data-refresh-seconds="0"' in off
    assert [int(s) for s in re.findall(r'<option value="(\d+)"', off)] == [5, 10, 30]
    assert "django_redlock/admin/locks.js" in off

    on = admin_client.get(reverse(LIST), {"refresh": "10", "o": "ttl", "p": "1"}).content.decode()
    assert '<option value="10" selected>every 10 s</option>' in on and 'data-refresh-seconds="10"' in on
    # What it loads again: this page's GET address (a refresh never repeats a POST).
    assert f'data-refresh-url="{reverse(LIST)}?o=ttl&amp;refresh=10&amp;p=1"' in on
    assert '<span id="redlock-refresh-status" class="small quiet" role="status">Refreshing every 10 s.</span>' in on
    form = re.search(r'<form id="redlock-refresh" method="get".*?</form>', on, re.S).group(0)
    assert '<input type="hidden" name="o" value="ttl">' in form and 'name="refresh"' in form
    assert "?o=-ttl&refresh=10" in links(on) and "?o=ttl&state=held&refresh=10" in links(on)


def test_the_page_is_labelled_for_screen_readers(admin_client):
    get_lock_manager().acquire("labelled", ttl=30)
    page = admin_client.get(reverse(LIST), {"o": "-ttl"}).content.decode()
    assert '<caption class="visually-hidden">Live locks</caption>' in page
    table = re.search(r'<table id="result_list">.*?</table>', page, re.S).group(0)
    assert table.count('<th scope="col"') == 8 and '<th scope="row" class="field-resource">' in table
    assert 'aria-sort="descending"' in page and page.count("aria-sort=") == 1
    assert 'aria-label="Select all objects on this page for an action"' in page
    assert 'aria-label="Select this object for an action - labelled"' in page
    assert '<div id="redlock-messages" role="status">' in page


def round_trips(server):
    """Calls from clients that read lock keys: scripts (the commands they run inside are counted apart) and
    the plain reads a page could make per lock."""
    with redis.Redis.from_url(server.url) as client:
        stats = client.info("commandstats")
    calls = {name[len("cmdstat_"):]: stat["calls"] for name, stat in stats.items()}
    return calls.get("eval", 0) + calls.get("evalsha", 0), calls.get("pttl", 0), calls.get("get", 0)


def test_ten_thousand_locks_filtered_or_not_are_one_reading(admin_client, servers):
    """No round trip per row: each page is the nodes' status, then one walk (SCAN pages of 1,000) and its reads."""
    from django_redlock.core.records import Holder

    for server in servers:
        with redis.Redis.from_url(server.url) as client:
            pipe = client.pipeline(transaction=False)
            for i in range(10_000):
                pipe.set(f"redlock:lock:job-{i:05d}", Holder(f"t{i}", "h", 1, "bulk").encode(), px=120_000)
            pipe.execute()
    for server in servers[2:]:  # every 100th lock left on two nodes only: a minority left-over
        with redis.Redis.from_url(server.url) as client:
            client.delete(*[f"redlock:lock:job-{i:05d}" for i in range(0, 10_000, 100)])
    for query, shown in (
        ({}, "10000 locks ·"),
        ({"state": "held"}, "9900 locks ·"),
        ({"state": "minority", "o": "-ttl"}, "100 locks ·"),
    ):
        scripts, pttls, gets = round_trips(servers[0])
        page = admin_client.get(reverse(LIST), query).content.decode()
        after = round_trips(servers[0])
        assert shown in page and len(states_shown(page)) == 100
        # About ten script calls (a SCAN page of 1,000 keys each, the waiting lines, the page's keys): never one a row.
        assert after[0] - scripts < 30, (query, after[0] - scripts)
        # Inside the scripts: each lock key read once at most, plus the page's rows again.
        assert after[1] - pttls <= 10_000 + 100 and after[2] - gets <= 10_000 + 100, (query, after)
        if not query:  # in resource order the walk reads key names alone: values only for the page's rows
            assert after[2] - gets <= 100, after
        print(query, re.search(r"· (\d+) ms", page).group(1), "ms")


# -- damaged and hostile values on the nodes ----------------------------------------------


def test_damaged_holder_values_never_take_the_admin_down(django_user_model, servers):
    """acquired_at of 1e20 or NaN once made 4 of 5 pages answer 500."""
    from tests.hostile_values import HOSTILE, write_hostile

    write_hostile(servers)
    client, _ = staff(django_user_model, "view_lock", "release_lock")
    client.raise_request_exception = False  # count the pages that fail
    pages = [
        (LIST, {}),
        (LIST, {"o": "acquired"}),
        (LIST, {"o": "-acquired"}),
        (LIST, {"o": "holder"}),
        (LIST, {"state": "held"}),
        (LIST, {"q": "date"}),
    ]
    pages += [(DETAIL, {"resource": resource}) for resource in HOSTILE if "\n" not in resource]
    pages += [(RELEASE, {"resource": list(HOSTILE)[:4]})]
    failed = []
    for name, query in pages:
        response = client.get(reverse(name), query)
        if response.status_code != 200:
            failed.append((name, query, response.status_code))
    assert failed == [], "\n".join(map(repr, failed)) + f" {len(failed)} of {len(pages)}"
    page = client.get(reverse(LIST)).content.decode()
    assert page.count('class="field-holder"') == len(HOSTILE)  # one row each: a newline forges none
    assert "web-1:11" in page  # the fields that are sound are still shown


def test_the_locks_page_and_its_action_use_no_deprecated_django_api(django_user_model):
    """Django 6.1 deprecates get_actions() without action_location and indexing an action: the
    matrix runs this on 6.1, and on 5.2 and 6.0 the same page and action must still work."""
    get_lock_manager().acquire("deprecated-api", ttl=30)
    client, _ = staff(django_user_model, "view_lock", "release_lock")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = client.get(reverse(LIST)).content.decode()
        done = action_post(client, ["deprecated-api"], post="yes")
    assert '<option value="force_release_selected">' in page and done.status_code == 302
    assert not get_lock_manager().is_locked("deprecated-api")
    deprecated = [
        str(w.message) for w in caught
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning)) and w.category.__module__.startswith("django.")
    ]
    assert deprecated == []
