"""REDLOCK['MAX_TTL']: the system check (E003) and the decorators refuse what clients could disagree on."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError

from django_redlock import conf, redlock
from django_redlock.checks import Codes, check_settings

pytestmark = pytest.mark.usefixtures("redlock_settings")
BASE = {"NODE_TIMEOUT": 0.05, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}  # as tests/settings.py


def errors_of(code):
    return [m for m in check_settings() if m.id == code]


def test_default_is_sixty_and_reaches_the_engine(settings):
    settings.REDLOCK = {}
    assert conf.get_config()["MAX_TTL"] == 60.0
    assert conf.ENGINE_KEYS["MAX_TTL"] == "max_ttl"
    assert errors_of(Codes.MAX_TTL) == []


def test_every_disagreement_is_reported_at_once(settings):
    settings.REDLOCK = {"TTL": 90, "COMMAND_TTL": 120, "RESTART_WINDOW": 10, "MAX_TTL": 60}
    found = errors_of(Codes.MAX_TTL)
    assert Codes.MAX_TTL == "django_redlock.E003"
    assert len(found) == 3 and all(m.is_serious() for m in found)
    text = [m.msg + " | " + m.hint for m in found]
    assert "REDLOCK['TTL']" in text[0] and "90" in text[0] and "at most 60" in text[0]
    assert "REDLOCK['COMMAND_TTL']" in text[1] and "120" in text[1] and "at most 60" in text[1]
    assert "REDLOCK['RESTART_WINDOW']" in text[2] and "10" in text[2] and "at least 60" in text[2]


@pytest.mark.parametrize("window", [None, 0, 60, 600])
def test_window_off_or_covering_max_ttl_passes(settings, window):
    settings.REDLOCK = {"TTL": 60, "COMMAND_TTL": 60, "RESTART_WINDOW": window, "MAX_TTL": 60}
    assert errors_of(Codes.MAX_TTL) == []


@pytest.mark.parametrize("value", [0, -1, "60", None, True])
def test_bad_max_ttl_is_a_settings_error(settings, value):
    settings.REDLOCK = {"MAX_TTL": value}
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS] and "MAX_TTL" in messages[0].msg


def test_manage_py_check_fails_listing_them_all(settings):
    settings.REDLOCK = {"TTL": 90, "COMMAND_TTL": 120, "RESTART_WINDOW": 10, "MAX_TTL": 60}
    with pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert str(info.value).count(Codes.MAX_TTL) == 3


def test_decorated_function_with_ttl_above_max_ttl_fails_clearly(settings):
    settings.REDLOCK = {**BASE, "MAX_TTL": 60}

    @redlock("job", ttl=90)  # decoration reads no setting
    def job():
        return "ran"

    with pytest.raises(ValueError, match=r"max_ttl|MAX_TTL"):
        job()
    settings.REDLOCK = {**BASE, "MAX_TTL": 120}
    assert job() == "ran"


def test_command_lock_ttl_above_max_ttl_fails_clearly(settings):
    settings.REDLOCK = {**BASE, "MAX_TTL": 60}
    with pytest.raises(CommandError, match="MAX_TTL") as info:
        call_command("nightly", lock_ttl=90, stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == 1


def test_status_sits_out_for_the_engines_window(settings):
    import inspect
    import json

    from django_redlock import get_lock_manager
    from django_redlock.core import LockManager
    from django_redlock.exit_codes import ExitCode

    settings.REDLOCK = {"NODE_TIMEOUT": 0.05, "RETRY_COUNT": 0, "MAX_TTL": 45}  # no RESTART_WINDOW: it follows MAX_TTL
    out = StringIO()
    try:
        call_command("redlock", "status", "--json", stdout=out, stderr=StringIO())
    except CommandError as exc:
        assert exc.returncode in (ExitCode.NO_QUORUM, ExitCode.DEGRADED)  # nodes young enough sit out
    window = get_lock_manager().config.restart_window
    if "max_ttl" in inspect.signature(LockManager).parameters:
        assert window >= 45
    for node in json.loads(out.getvalue())["nodes"]:
        assert node["sits_out_for"] == pytest.approx(max(0.0, window - node["uptime"]), abs=1.5)
        assert node["votes"] is (node["sits_out_for"] == 0)
