"""The package's user-facing texts are translated: the shipped German catalog is used, complete and
compiled, and ``makemessages`` finds nothing it lacks."""

from __future__ import annotations

import ast
import gettext
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.utils import translation

from django_redlock import get_lock_manager

PACKAGE = Path(__file__).resolve().parent.parent / "django_redlock"
CATALOG = PACKAGE / "locale" / "de" / "LC_MESSAGES"
LOCKED_DE = "Gerade arbeitet jemand anderes daran. Bitte versuchen Sie es in Kürze erneut."


def read_po(path: Path) -> dict[tuple[str, str | None], list[str]]:
    """The entries of a .po file: (msgid, msgid_plural) -> the msgstr(s); fuzzy ones are left out."""
    entries: dict[tuple[str, str | None], list[str]] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith("#~")]
        if any(line.startswith("#,") and "fuzzy" in line for line in lines):
            continue
        fields: dict[str, str] = {}
        key = None
        for line in lines:
            if line.startswith("#"):
                continue
            match = re.match(r'^(msgid|msgid_plural|msgstr(?:\[\d+\])?) (".*")$', line)
            if match:
                key = match.group(1)
                fields[key] = ast.literal_eval(match.group(2))
            elif line.startswith('"') and key:
                fields[key] += ast.literal_eval(line)
        if "msgid" in fields and fields["msgid"]:
            strings = [fields[k] for k in sorted(fields) if k.startswith("msgstr")]
            entries[(fields["msgid"], fields.get("msgid_plural"))] = strings
    return entries


# -- the catalog -----------------------------------------------------------------------


def test_the_german_catalog_is_complete_and_its_compiled_form_matches():
    entries = read_po(CATALOG / "django.po")
    assert len(entries) >= 40
    untranslated = [msgid for msgid, strings in entries.items() if not all(strings)]
    assert untranslated == [], "untranslated (or fuzzy) entries in the German catalog"
    with open(CATALOG / "django.mo", "rb") as compiled:
        mo = gettext.GNUTranslations(compiled)
    for (msgid, plural), strings in entries.items():
        if plural is None:
            assert mo.gettext(msgid) == strings[0], f"django.mo is older than django.po: {msgid!r}"
        else:
            assert [mo.ngettext(msgid, plural, n) for n in (1, 2)] == strings, msgid
    # Placeholders survive translation: a missing or renamed one would break at run time.
    for (msgid, plural), strings in entries.items():
        assert placeholders(strings[-1]) == placeholders(plural or msgid), (msgid, strings)
        assert placeholders(strings[0]) <= placeholders(msgid + (plural or "")), (msgid, strings)


def placeholders(text: str) -> set[str]:
    return set(re.findall(r"%\(\w+\)[sd]", text))


def test_makemessages_finds_no_string_the_catalog_lacks(tmp_path):
    """Run on a copy of the package: every string marked for translation is in the German catalog,
    and the catalog holds no string the package no longer has."""
    if shutil.which("xgettext") is None:
        pytest.skip("GNU gettext is not installed (Debian: apt-get install gettext); only makemessages needs it")
    copy = tmp_path / "django_redlock"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    result = subprocess.run(
        [sys.executable, "-m", "django", "makemessages", "-l", "de", "--no-obsolete"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    extracted = set(read_po(copy / "locale" / "de" / "LC_MESSAGES" / "django.po"))
    shipped = set(read_po(CATALOG / "django.po"))
    assert extracted - shipped == set(), "marked for translation but not in the catalog: run makemessages"
    assert shipped - extracted == set(), "in the catalog but no longer in the package: run makemessages"


# -- used at run time ------------------------------------------------------------------


@pytest.mark.usefixtures("redlock_settings")
def test_the_423_answer_is_translated():
    lock = get_lock_manager().acquire("invoice-31", 4)
    try:
        with translation.override("de"):
            page = Client().get("/pay/31/", HTTP_ACCEPT="text/html")
            body = Client().get("/pay/31/", HTTP_ACCEPT="application/json").json()
            problem = json.loads(Client().get("/pay/31/", HTTP_ACCEPT="application/problem+json").content)
        english = Client().get("/pay/31/", HTTP_ACCEPT="application/json").json()
    finally:
        lock.release()
    assert page.status_code == 423
    html = page.content.decode()
    assert '<html lang="de">' in html and "<title>423 Gesperrt</title>" in html and f"<p>{LOCKED_DE}</p>" in html
    assert body["detail"] == LOCKED_DE and body["code"] == "locked"  # codes stay as they are
    assert problem["title"] == "Gesperrt" and problem["detail"] == LOCKED_DE and problem["type"] == "about:blank"
    assert english["detail"] == "Someone else is working on this right now. Please try again shortly."


def test_a_rest_framework_answer_is_translated(redlock_settings, settings):
    pytest.importorskip("rest_framework")
    settings.ROOT_URLCONF = "tests.urls_api"
    lock = get_lock_manager().acquire("refund-32", 4)
    try:
        with translation.override("de"):
            response = Client().post("/api/refund/32/", HTTP_ACCEPT="application/json")
    finally:
        lock.release()
    assert response.status_code == 423 and json.loads(response.content)["detail"] == LOCKED_DE


@pytest.mark.django_db
@pytest.mark.usefixtures("redlock_settings")
def test_the_admin_page_is_translated(django_user_model):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.login(username="admin", password="pw")
    lock = get_lock_manager().acquire("invoice-33", 10)
    try:
        with translation.override("de"):
            page = client.get("/admin/django_redlock/lock/").content.decode()
    finally:
        lock.release()
    assert "Aktive Sperren" in page  # the template's heading
    assert "von einem Quorum gehalten" in page  # the lock's state
    assert ">Ressource</a>" in page  # a column heading, from admin.py
    english = client.get("/admin/django_redlock/lock/").content.decode()
    assert "Live locks" in english and ">Resource</a>" in english  # and back in English, per request


def test_every_lock_state_word_is_translated():
    from django_redlock.core.records import STATE_WORDS

    with translation.override("de"):
        german = {state: translation.gettext(word) for state, word in STATE_WORDS.items()}
    assert all(german[state] != word for state, word in STATE_WORDS.items()), german
