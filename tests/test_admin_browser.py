"""The Locks page in a real headless browser (Debian's chromium driven by Playwright): the mouse, the
keyboard alone, what a screen reader is told, and the auto-refresh on a clock the test moves."""

from __future__ import annotations

import os
import shutil

import pytest
import redis

from django_redlock import get_lock_manager
from django_redlock.core.records import Holder

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redlock_settings")]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "img", "admin-locks.png")
LOCKS = "/admin/django_redlock/lock/"


@pytest.fixture
def browser(monkeypatch):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); 'make test' installs it as root")
    playwright = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop; set for this test only (a subprocess started later
    # by another test would inherit it: Django's deploy check refuses it).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
            ],
        )
        yield browser
        browser.close()


def some_locks(servers):
    manager = get_lock_manager()
    for name, label in [("invoice-1042", "billing"), ("nightly-report", "cron"), ("user-7-export", None)]:
        manager.acquire(name, ttl=60, label=label)  # MAX_TTL: long enough for the browser to find it
    for server in servers[:2]:  # a minority left-over: a crashed attempt's keys on two nodes of five
        with redis.Redis.from_url(server.url) as client:
            client.set("redlock:lock:old-import", Holder("gone", "batch-7", 311).encode(), px=60_000)
    return manager


def logged_in(browser, live_server, django_user_model, path=LOCKS, clock=False, width=1200, height=700):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw-for-browser")
    page = browser.new_page(viewport={"width": width, "height": height})
    if clock:
        page.clock.install()  # timers run only when the test moves the clock
    page.goto(f"{live_server.url}/admin/login/?next={path}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw-for-browser")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    return page


def test_login_see_filter_and_force_release_with_the_mouse(browser, live_server, django_user_model, servers, tmp_path):
    manager = some_locks(servers)
    page = logged_in(browser, live_server, django_user_model, width=1440)
    assert page.locator("text=invoice-1042").count() == 1
    assert page.locator("td.field-state >> text=held by a quorum").count() == 3
    # REDLOCK_UPDATE_SCREENSHOTS=1 refreshes the picture in the docs.
    shot = SCREENSHOT if os.environ.get("REDLOCK_UPDATE_SCREENSHOTS") else str(tmp_path / "locks.png")
    page.screenshot(path=shot, full_page=True)
    assert os.path.getsize(shot) > 10_000

    page.click("#changelist-filter >> text=minority left-over")
    page.wait_for_url("**state=minority")
    assert page.locator("th.field-resource").all_inner_texts() == ["old-import"]
    page.click("#changelist-filter >> text=All")
    page.wait_for_selector("th.field-resource >> text=invoice-1042")

    page.check("input.action-select[value='nightly-report']")
    assert page.locator("span.action-counter").inner_text() == "1 of 4 selected"  # Django's actions.js runs
    page.select_option("select[name=action]", "force_release_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure?")
    assert page.locator("#redlock-confirm-list li").all_inner_texts() == ["nightly-report — held by a quorum"]
    page.click("input[value='Yes, release']")
    page.wait_for_selector("#result_list")
    assert page.get_by_role("status").filter(has_text="Released").inner_text() == (
        "Released 1 lock: nightly-report (on 5 of 5 nodes)."
    )
    assert page.locator("th.field-resource >> text=nightly-report").count() == 0
    assert not manager.is_locked("nightly-report")
    assert manager.is_locked("invoice-1042")


#: Describes the focused element: what the tab walk records.
FOCUSED = """() => {
    const el = document.activeElement;
    const style = getComputedStyle(el);
    return {
        key: el.id || el.getAttribute('name') && `${el.getAttribute('name')}=${el.value}` || el.getAttribute('href')
             || el.tagName.toLowerCase() + ':' + (el.value || el.textContent.trim()),
        inContent: !!el.closest('#content-main'),
        outline: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2,
    };
}"""

#: The controls of the page's content, in document order, each as FOCUSED describes it.
CONTROLS = """() => Array.from(document.querySelectorAll(
        '#content-main a[href], #content-main input:not([type=hidden]), #content-main select, '
        + '#content-main button, #content-main summary')).map(el =>
    el.id || el.getAttribute('name') && `${el.getAttribute('name')}=${el.value}` || el.getAttribute('href')
    || el.tagName.toLowerCase() + ':' + (el.value || el.textContent.trim()))"""

#: Form controls of the content without a name a screen reader can read out.
UNNAMED = """() => Array.from(document.querySelectorAll(
        '#content-main input:not([type=hidden]), #content-main select, #content-main button')).filter(el =>
    !(el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') || (el.labels && el.labels.length)
      || (el.type === 'submit' && el.value) || el.textContent.trim())).map(el => el.outerHTML)"""


def tab_to(page, key, limit=120, back=False):
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        if page.evaluate(FOCUSED)["key"] == key:
            return
    raise AssertionError(f"{key} not reached by the keyboard")


def test_keyboard_only_and_what_a_screen_reader_is_told(browser, live_server, django_user_model, servers):
    manager = some_locks(servers)
    page = logged_in(browser, live_server, django_user_model)

    # Accessible names, as the browser computes them for assistive technology.
    assert page.get_by_role("table", name="Live locks").count() == 1
    assert page.get_by_role("columnheader", name="Resource").count() == 1
    assert page.get_by_role("rowheader", name="invoice-1042").count() == 1
    assert page.get_by_role("checkbox", name="Select all objects on this page for an action").count() == 1
    assert page.get_by_role("checkbox", name="Select this object for an action - nightly-report").count() == 1
    assert page.get_by_role("combobox", name="Action:").count() == 1
    assert page.get_by_role("combobox", name="Auto-refresh").count() == 1
    assert page.get_by_role("button", name="Go").count() == 1 and page.get_by_role("button", name="Apply").count() == 1
    sidebar = page.get_by_role("navigation", name="Filter")
    assert sidebar.get_by_role("link", name="minority left-over").count() == 1
    assert sidebar.locator("[aria-current=true]").inner_text() == "All"
    assert page.evaluate(UNNAMED) == []

    # Every control of the content is reached by Tab, in the order it is read, each with a visible focus.
    page.locator("body").focus()
    walk = []
    for _ in range(200):
        page.keyboard.press("Tab")
        focused = page.evaluate(FOCUSED)
        if walk and focused["key"] == walk[0]["key"]:
            break  # round the page once
        walk.append(focused)
    reached = [f["key"] for f in walk if f["inContent"]]
    assert reached == page.evaluate(CONTROLS)
    assert [f["key"] for f in walk if f["inContent"] and not f["outline"]] == []
    order = ["searchbar", "redlock-refresh-interval", "action=", "index=0", "action-toggle",
             "_selected_action=invoice-1042", "?state=held"]
    assert [reached.index(key) for key in order] == sorted(reached.index(key) for key in order)

    # Force-release one lock with the keyboard alone: select it, choose the action, Go, confirm.
    page.locator("body").focus()
    tab_to(page, "_selected_action=nightly-report")
    page.keyboard.press("Space")
    assert page.locator("input.action-select:checked").count() == 1
    tab_to(page, "action=", back=True)
    page.keyboard.press("ArrowDown")
    assert page.eval_on_selector("select[name=action]", "el => el.value") == "force_release_selected"
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED)["key"] == "index=0"
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Are you sure?")
    tab_to(page, "input:Yes, release")
    assert page.evaluate(FOCUSED)["outline"]
    page.keyboard.press("Enter")
    page.wait_for_selector("#result_list")
    status = page.get_by_role("status").filter(has_text="Released")
    assert status.inner_text() == "Released 1 lock: nightly-report (on 5 of 5 nodes)."
    assert not manager.is_locked("nightly-report") and manager.is_locked("invoice-1042")


def test_auto_refresh_pauses_while_rows_are_selected(browser, live_server, django_user_model, servers):
    manager = some_locks(servers)
    page = logged_in(browser, live_server, django_user_model, path=LOCKS + "?refresh=5", clock=True)
    status = page.locator("#redlock-refresh-status")
    assert status.inner_text() == "Refreshing every 5 s." and status.get_attribute("role") == "status"
    manager.acquire("arrived-later", ttl=60)
    page.focus("#redlock-refresh-interval")
    with page.expect_navigation():
        page.clock.run_for(6000)
    page.wait_for_selector("th.field-resource >> text=arrived-later")
    assert page.url.endswith(LOCKS + "?refresh=5")  # the same GET address, never a form's POST
    assert page.evaluate("document.activeElement.id") == "redlock-refresh-interval"  # the focus stays put

    page.check("input.action-select[value='invoice-1042']")
    manager.acquire("not-yet", ttl=60)
    page.evaluate("window.stillHere = true")
    page.clock.run_for(31_000)
    assert page.evaluate("window.stillHere === true")  # no reload while a row is selected
    assert status.inner_text() == "Auto-refresh paused while locks are selected or an action is chosen."
    assert page.locator("th.field-resource >> text=not-yet").count() == 0
    page.uncheck("input.action-select[value='invoice-1042']")
    page.clock.run_for(2000)
    assert status.inner_text() == "Refreshing every 5 s." and page.evaluate("window.stillHere === true")
    with page.expect_navigation():
        page.clock.run_for(5000)  # a full interval after the pause ended
    page.wait_for_selector("th.field-resource >> text=not-yet")

    # The confirmation page, reached by a POST, has no refresh at all.
    page.check("input.action-select[value='not-yet']")
    page.select_option("select[name=action]", "force_release_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure?")
    page.evaluate("window.stillHere = true")
    page.clock.run_for(60_000)
    assert page.evaluate("window.stillHere === true") and page.locator("#redlock-refresh").count() == 0
    assert manager.is_locked("not-yet")


#: Where an element is drawn: its box, and whether it is visible and not clipped by a scrolling parent.
SHOWN = """el => {
    const box = el.getBoundingClientRect();
    let clipped = false;
    for (let up = el.parentElement; up; up = up.parentElement) {
        const style = getComputedStyle(up);
        if (style.overflowX !== 'visible') {
            const outer = up.getBoundingClientRect();
            clipped = clipped || box.left < outer.left - 0.5 || box.right > outer.right + 0.5;
        }
    }
    const style = getComputedStyle(el);
    return {left: box.left, right: box.right, width: box.width, height: box.height, clipped,
            visible: style.visibility !== 'hidden' && style.display !== 'none' && box.width > 0 && box.height > 0};
}"""


def test_state_column_is_on_screen_at_1280_pixels(browser, live_server, django_user_model, servers, tmp_path):
    """A laptop's 1280 x 800: every column, the State last, fits beside the filter, with no sideways scroll."""
    some_locks(servers)
    page = logged_in(browser, live_server, django_user_model, width=1280, height=800)
    page.screenshot(path=str(tmp_path / "locks-1280.png"), full_page=True)
    cells = [page.locator("th.column-state")] + page.locator("td.field-state").all()
    assert len(cells) == 1 + 4
    for cell in cells:
        shown = cell.evaluate(SHOWN)
        assert shown["visible"] and not shown["clipped"], shown
        assert 0 <= shown["left"] and shown["right"] <= 1280, shown
    assert page.locator("th.column-state").inner_text().lower() == "state"  # drawn in capitals
    assert page.locator("td.field-state >> text=minority left-over").is_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
