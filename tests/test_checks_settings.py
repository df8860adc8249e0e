"""The checks refuse every REDLOCK value the first lock would refuse, in the setting's own name."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redlock import get_lock_manager
from django_redlock.checks import Codes, check_settings

pytestmark = pytest.mark.usefixtures("redlock_settings")

BAD = [
    ("RETRY_COUNT", "3", "a whole number >= 0"),
    ("RETRY_COUNT", -1, "a whole number >= 0"),
    ("RETRY_COUNT", 2.5, "a whole number >= 0"),
    ("RETRY_COUNT", True, "a whole number >= 0"),
    ("MAX_EXTENSIONS", "x", "a whole number >= 0"),
    ("MAX_EXTENSIONS", -2, "a whole number >= 0"),
    ("LABEL", 5, "a string or None"),
    ("CLOCK_DRIFT_FACTOR", 2, "below 0.5"),
    ("CLOCK_DRIFT_FACTOR", -0.1, ">= 0"),
    ("CLOCK_DRIFT_FACTOR", "0.01", "number >= 0"),
    ("KEY_PREFIX", 3, "a string"),
    ("KEY_PREFIX", None, "a string"),
    ("RESTART_WINDOW", "60", "a number of seconds"),
    ("RESTART_WINDOW", -1, ">= 0"),
    ("TTL", 0.001, "at least 0.01"),
    ("TTL", "30", "a number of seconds"),
    ("TTL", None, "a number of seconds"),
    ("NODE_TIMEOUT", 0, "> 0"),
    ("NODE_TIMEOUT", float("nan"), "finite"),
    ("RETRY_DELAY", -1, ">= 0"),
    ("RETRY_JITTER", [1], "a number of seconds"),
    ("MAX_TTL", 0, "> 0"),
    ("COMMAND_TTL", -1, "> 0"),
    ("COMMAND_TTL", "60", "a number of seconds"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD)
def test_check_refuses_what_the_first_lock_refuses(settings, key, value, expected):
    settings.REDLOCK = {"RESTART_WINDOW": 0, key: value}
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS], messages
    text = messages[0].msg
    assert text.startswith(f"REDLOCK['{key}'] must "), text
    assert expected in text and repr(value) in text, text
    assert key.lower() + " " not in text  # the setting's name, not the engine's argument
    with pytest.raises(ImproperlyConfigured) as info:
        get_lock_manager()
    assert text in str(info.value)  # the same words at run time: one validation


def test_manage_py_check_fails_on_them_all_at_once(settings):
    settings.REDLOCK = {"RETRY_COUNT": "3", "MAX_EXTENSIONS": "x", "LABEL": 5, "CLOCK_DRIFT_FACTOR": 2}
    with pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    text = str(info.value)
    assert text.count(Codes.OPTIONS) == 4
    for key in ("RETRY_COUNT", "MAX_EXTENSIONS", "LABEL", "CLOCK_DRIFT_FACTOR"):
        assert f"REDLOCK['{key}']" in text


@pytest.mark.parametrize(
    "redlock",
    [
        {"RETRY_COUNT": None, "MAX_EXTENSIONS": None, "LABEL": "web", "RESTART_WINDOW": None},
        {"RETRY_COUNT": 0, "MAX_EXTENSIONS": 0, "CLOCK_DRIFT_FACTOR": 0, "KEY_PREFIX": "", "RESTART_WINDOW": 0},
        {"TTL": 5, "NODE_TIMEOUT": 0.1, "RETRY_DELAY": 0, "RETRY_JITTER": 0, "MAX_TTL": 120, "COMMAND_TTL": 120},
    ],
)
def test_good_values_pass_and_build(settings, redlock):
    settings.REDLOCK = redlock
    assert [m for m in check_settings() if m.is_serious()] == []
    get_lock_manager()


def test_the_checked_values_reach_the_engine(settings):
    settings.REDLOCK = {"RETRY_COUNT": 7, "MAX_EXTENSIONS": None, "LABEL": "web-1", "CLOCK_DRIFT_FACTOR": 0.02,
                        "RESTART_WINDOW": 0}
    config = get_lock_manager().config
    assert (config.retry_count, config.max_extensions, config.label) == (7, None, "web-1")
    assert config.clock_drift_factor == 0.02 and config.restart_window == 0


def test_unknown_keys_keep_their_hint(settings):
    settings.REDLOCK = {"RETRY_CUONT": 3, "RETRY_COUNT": "3"}
    texts = [m.msg for m in check_settings()]
    assert "REDLOCK has an unknown key 'RETRY_CUONT'; did you mean 'RETRY_COUNT'?" in texts
    assert any(t.startswith("REDLOCK['RETRY_COUNT'] must ") for t in texts) and len(texts) == 2


def locked_view(request, error):
    from django.http import HttpResponse

    return HttpResponse("busy", status=423)


NOT_CALLABLE = 42


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("no.such.path", "cannot be imported"),
        ("nodots", "cannot be imported"),
        ("tests.test_checks_settings.missing_view", "cannot be imported"),
        ("tests.test_checks_settings.NOT_CALLABLE", "callable"),
        (5, "callable"),
    ],
)
def test_a_locked_response_that_cannot_answer_fails_check(settings, value, expected):
    settings.REDLOCK = {"RESTART_WINDOW": 0, "LOCKED_RESPONSE": value}
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS], messages
    assert messages[0].msg.startswith("REDLOCK['LOCKED_RESPONSE']") and expected in messages[0].msg
    assert repr(value) in messages[0].msg


@pytest.mark.parametrize("value", ["tests.test_checks_settings.locked_view", locked_view, None])
def test_a_locked_response_that_can_answer_passes(settings, value):
    settings.REDLOCK = {"RESTART_WINDOW": 0, "LOCKED_RESPONSE": value}
    assert check_settings() == []


def test_a_module_that_fails_to_import_is_reported_not_raised(settings, tmp_path, monkeypatch):
    (tmp_path / "broken_answers.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.REDLOCK = {"RESTART_WINDOW": 0, "LOCKED_RESPONSE": "broken_answers.view"}
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS]
    assert "REDLOCK['LOCKED_RESPONSE']" in messages[0].msg and "boom at import" in messages[0].msg


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("django_redlock.metrics.PrometheusHooks", "must be a list"),
        (["no.such.Hooks"], "cannot be imported"),
        ([42], "must name a django_redlock.core.Hooks"),
        (["tests.test_checks_settings.locked_view"], "must name a django_redlock.core.Hooks"),
    ],
)
def test_hooks_that_cannot_be_used_fail_check(settings, value, expected):
    settings.REDLOCK = {"RESTART_WINDOW": 0, "HOOKS": value}
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS], messages
    assert "REDLOCK['HOOKS']" in messages[0].msg and expected in messages[0].msg


def test_hooks_that_can_be_used_pass_check(settings):
    settings.REDLOCK = {"RESTART_WINDOW": 0, "HOOKS": ["django_redlock.core.Hooks"]}
    assert check_settings() == []


def test_hooks_and_locked_response_are_reported_with_the_other_problems(settings, tmp_path, monkeypatch):
    (tmp_path / "broken_hooks.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.REDLOCK = {
        "RETRY_COUNT": "3",
        "HOOKS": ["broken_hooks.Hooks", "django_redlock.core.Hooks", "no.such.Hooks", 42],
        "LOCKED_RESPONSE": "no.such.view",
    }
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.OPTIONS] * 5, messages
    texts = [m.msg for m in messages]
    assert texts[0].startswith("REDLOCK['RETRY_COUNT'] must ")
    assert texts[1].startswith("REDLOCK['LOCKED_RESPONSE'] = 'no.such.view' cannot be imported")
    assert texts[2] == "REDLOCK['HOOKS'][0] = 'broken_hooks.Hooks' cannot be imported: RuntimeError: boom at import"
    assert texts[3].startswith("REDLOCK['HOOKS'][2] = 'no.such.Hooks' cannot be imported")
    assert texts[4].startswith("REDLOCK['HOOKS'][3] must name a django_redlock.core.Hooks")


def test_a_redlock_that_is_not_a_dict_is_reported_alone(settings):
    settings.REDLOCK = ["TTL", 10]
    assert [m.msg for m in check_settings()] == ["REDLOCK must be a dict of engine defaults; got list."]


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("REDLOCKS", "REDLOCK"),
        ("REDLOK", "REDLOCK"),
        ("RED_LOCK", "REDLOCK"),
        ("REDLOCK_CONFIG", "REDLOCK"),
        ("REDLOCK_NODE", "REDLOCK_NODES"),
        ("REDLOCK_NODES_", "REDLOCK_NODES"),
        ("REDLOCK_NODS", "REDLOCK_NODES"),
        ("REDLOCK_SERVERS", "REDLOCK_NODES"),
        ("REDLOCK_TTL", "REDLOCK['TTL']"),
        ("REDLOCK_MAX_TTL", "REDLOCK['MAX_TTL']"),
        ("REDLOCK_URLS", "REDLOCK or REDLOCK_NODES"),
    ],
)
def test_a_setting_name_like_ours_is_named_with_the_one_meant(settings, name, meant):
    setattr(settings, name, {"TTL": 10})
    assert [(m.id, m.msg) for m in check_settings()] == [
        (Codes.OPTIONS, f"settings.{name} is not a django-redlock setting; did you mean {meant}?")
    ]
    with pytest.raises(ImproperlyConfigured, match=f"settings.{name} is not a django-redlock setting"):
        get_lock_manager()


@pytest.mark.parametrize("name", ["DEADLOCK", "REDIS_LOCK", "REDIS_URL", "CELERY_BROKER_URL", "LOCK_TIMEOUT", "REDIS_LOCKS_DB"])
def test_other_settings_are_left_alone(settings, name):
    setattr(settings, name, "x")
    settings.REDLOCK = {"RESTART_WINDOW": 0}
    assert check_settings() == []


def test_a_misspelt_nodes_setting_is_named_when_nodes_are_missing(settings):
    settings.REDLOCK_NODES_ = ["redis://127.0.0.1:6379/0"]
    del settings.REDLOCK_NODES
    with pytest.raises(ImproperlyConfigured, match=r"^REDLOCK_NODES is not set \(settings.REDLOCK_NODES_ is set"):
        get_lock_manager()
