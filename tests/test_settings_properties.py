"""Property-based tests of settings parsing: any input is accepted or refused with a clear error."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from django_redlock import conf
from django_redlock.core.nodes import parse_nodes

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True), st.text(max_size=10)
)
KEYS = st.one_of(st.sampled_from(sorted(conf.DEFAULTS)), st.text(min_size=1, max_size=12))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(redlock=st.dictionaries(KEYS, VALUES, max_size=4))
def test_redlock_dict_is_accepted_or_refused_by_name(settings, redlock):
    settings.REDLOCK = redlock
    try:
        config = conf.get_config()
    except ImproperlyConfigured as exc:
        text = str(exc)
        assert "REDLOCK" in text
        assert any(repr(k) in text or f"['{k}']" in text for k in redlock), text
    else:
        assert set(config) == set(conf.DEFAULTS)
        for key in ("TTL", "NODE_TIMEOUT", "MAX_TTL", "COMMAND_TTL"):
            assert config[key] > 0


SETTING_VALUES = st.one_of(
    VALUES, st.floats(0, 1), st.floats(0.01, 200), st.integers(0, 200), st.sampled_from(["web", "", "redlock:"])
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(redlock=st.dictionaries(st.sampled_from(sorted(set(conf.DEFAULTS) - {"LOCKED_RESPONSE"})), SETTING_VALUES))
def test_check_and_first_lock_agree(settings, redlock):
    """What ``check`` passes builds a manager; what the first lock would refuse, ``check`` refuses."""
    from django_redlock import get_lock_manager
    from django_redlock.checks import Codes, check_settings

    settings.REDLOCK_NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.2:1/0", "redis://127.0.0.3:1/0"]
    settings.REDLOCK = redlock
    errors = [m for m in check_settings() if m.is_serious()]
    assert {m.id for m in errors} <= {Codes.OPTIONS, Codes.MAX_TTL}
    try:
        get_lock_manager()
    except ImproperlyConfigured as exc:
        assert errors, f"check passed {redlock!r}, the first lock raised {exc}"
        refused = [m for m in errors if m.id == Codes.OPTIONS]
        # check reports HOOKS along with the rest; the first lock gets to them once the rest is right
        first = [m for m in refused if not m.msg.startswith("REDLOCK['HOOKS']")] or refused
        for message in first:
            assert message.msg in str(exc)  # the same rule, in the same words
    else:
        assert not [m for m in errors if m.id == Codes.OPTIONS], f"check refused {redlock!r}, which the engine takes"


SCHEMES = st.sampled_from(["redis://", "rediss://", "unix://", "http://", "", "redis:"])
URLS = st.builds(lambda s, body: s + body, SCHEMES, st.text(max_size=30))


@settings(max_examples=300, deadline=None)
@given(url=URLS, secret=st.text(alphabet="abcdefghXYZ0123456789", min_size=12, max_size=16))
def test_node_urls_parse_or_fail_clearly_without_leaking(url, secret):
    assume(secret not in url)  # the password must be the only place the secret appears
    full = url.replace("://", f"://:{secret}@", 1) if "://" in url else url
    try:
        nodes = parse_nodes([full], 0.05)
    except ValueError as exc:
        assert "nodes[0]" in str(exc)
        assert secret not in str(exc)
    else:
        assert len(nodes) == 1 and secret not in nodes[0].name and secret not in repr(nodes[0])


@pytest.mark.parametrize("bad", [None, 3, "redis://x", {"URL": "redis://x"}, b"redis://x"])
def test_nodes_must_be_a_list(bad):
    with pytest.raises(ValueError, match="nodes"):
        parse_nodes(bad, 0.05)


def test_a_url_option_redis_py_refuses_names_the_entry():
    """Found by the property above: 'redis://0?=0' passes a keyword named '' to redis-py."""
    with pytest.raises(ValueError, match=r"^nodes\[0\]: node .*invalid connection options") as info:
        parse_nodes(["redis://:s3cret-value@0?=0"], 0.05)
    assert "s3cret-value" not in str(info.value)


NODE_KEYS = st.one_of(st.sampled_from(["URL", "OPTIONS", "FSYNC_ALWAYS", "url", "Options", "OPTION"]),
                      st.text(max_size=12), st.integers())
NODE_VALUES = st.one_of(VALUES, st.just("redis://:{secret}@127.0.0.1:1/0"), st.just({"password": "{secret}"}),
                        st.just("cache:lock0"))


@settings(max_examples=300, deadline=None)
@example(entry={"URL": "redis://127.0.0.1:1/0", "FSYNC_ALWAYS": "redis://:{secret}@127.0.0.1:1/0"},
         secret="abcdefghXYZ0123")  # a URL pasted into the wrong key
@example(entry={"URL": "redis://127.0.0.1:1/0", "FSYNC_ALWAYS": {"password": "{secret}"}}, secret="abcdefghXYZ0123")
@given(entry=st.dictionaries(NODE_KEYS, NODE_VALUES, max_size=4),
       secret=st.text(alphabet="abcdefghXYZ0123456789", min_size=12, max_size=16))
def test_node_dicts_parse_or_fail_by_name_without_leaking(entry, secret):
    def fill(value):
        if isinstance(value, str):
            return value.replace("{secret}", secret)
        return {"password": secret} if isinstance(value, dict) else value

    entry = {key: fill(value) for key, value in entry.items()}
    assume(not any(secret in str(key) for key in entry))
    try:
        nodes = parse_nodes([entry], 0.05)
    except ValueError as exc:
        assert str(exc).startswith("nodes[0]: ") and secret not in str(exc)
    else:
        assert set(entry) <= {"URL", "OPTIONS", "FSYNC_ALWAYS"} and secret not in repr(nodes[0])
