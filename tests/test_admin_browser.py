"""The Locks page in a real headless browser (Debian's chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil

import pytest

from django_redlock import get_lock_manager

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redlock_settings")]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "img", "admin-locks.png")


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); 'make test' installs it as root")
    playwright = pytest.importorskip("playwright.sync_api")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
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


def test_login_see_and_force_release(browser, live_server, django_user_model, tmp_path):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw-for-browser")
    manager = get_lock_manager()
    for name, label in [("invoice-1042", "billing"), ("nightly-report", "cron"), ("user-7-export", None)]:
        manager.acquire(name, ttl=60, label=label)  # MAX_TTL: long enough for the browser to find it
    page = browser.new_page(viewport={"width": 1200, "height": 640})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_redlock/lock/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw-for-browser")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    assert page.locator("text=invoice-1042").count() == 1
    assert page.locator("text=held by a quorum").count() == 3
    # REDLOCK_UPDATE_SCREENSHOTS=1 refreshes the picture in the docs.
    shot = SCREENSHOT if os.environ.get("REDLOCK_UPDATE_SCREENSHOTS") else str(tmp_path / "locks.png")
    page.screenshot(path=shot, full_page=True)
    assert os.path.getsize(shot) > 10_000

    page.check("input.action-select[value='nightly-report']")
    page.click("text=Force-release selected locks")
    page.wait_for_selector("text=Are you sure?")
    page.click("input[value='Yes, release']")
    page.wait_for_selector("#result_list")
    assert page.locator("text=Released 1 lock(s): nightly-report.").count() == 1
    assert page.locator("th.field-resource >> text=nightly-report").count() == 0
    assert not manager.is_locked("nightly-report")
    assert manager.is_locked("invoice-1042")
