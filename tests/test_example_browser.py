"""The example project's pages in a real headless browser: nothing wider than the window."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.template import Context, Engine

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TEMPLATES = Path(__file__).resolve().parent.parent / "example_project" / "shop" / "templates"
PORTS = "47101,47102,47103,47104,47105"


def page_html(name: str) -> str:
    """A demo page as the demo renders it (five masters on five-digit ports: the longest lines)."""
    nodes = [f"127.0.0.1:{port}/0" for port in PORTS.split(",")]
    context = {"nodes": nodes, "ports": PORTS, "seconds": 8}
    return Engine(dirs=[str(TEMPLATES)]).get_template(name).render(Context(context))


@pytest.fixture
def browser(monkeypatch):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); 'make test' installs it as root")
    playwright = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop; set for this test only (a subprocess started later
    # by another test would inherit it: Django's deploy check refuses it).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.mark.parametrize("width", [800, 360])
@pytest.mark.parametrize("name", ["shop/index.html", "shop/locked.html"])
def test_demo_pages_fit_the_window(browser, name, width, tmp_path):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_content(page_html(name))
    overflow = page.evaluate(
        """() => ({
            page: document.documentElement.scrollWidth - window.innerWidth,
            blocks: [...document.querySelectorAll('pre, .box')]
                .filter(el => el.scrollWidth > el.clientWidth)
                .map(el => el.textContent.slice(0, 60)),
        })"""
    )
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert overflow["page"] <= 0, f"{name} is {overflow['page']} px wider than a {width} px window"
    assert overflow["blocks"] == [], f"{name}: blocks wider than their box at {width} px"
    if name == "shop/index.html":  # each command stays one line of text, whatever the wrapping
        commands = page.locator("pre.command").all_inner_texts()
        assert [c.split()[-1] for c in commands] == ["list", "status"] and all("\n" not in c for c in commands)
