"""Settings: ``REDLOCK_NODES`` and the optional ``REDLOCK`` dict, read lazily.

Nothing is read at import. :func:`get_config` overlays the user's ``REDLOCK``
on :data:`DEFAULTS` once and caches the result; a ``setting_changed`` signal
for either setting clears the cache (and :mod:`django_redlock.manager` closes the
managers built from it).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_redlock.core.config import check_arguments

__all__ = ["DEFAULTS", "get_config", "get_nodes"]

#: Every key ``REDLOCK`` accepts, with its default.
DEFAULTS: dict[str, Any] = {
    "TTL": 30.0,
    "RETRY_COUNT": 3,
    "RETRY_DELAY": 0.2,
    "RETRY_JITTER": 0.1,
    "CLOCK_DRIFT_FACTOR": 0.01,
    "NODE_TIMEOUT": 0.05,
    "KEY_PREFIX": "redlock:",
    "MAX_EXTENSIONS": 100,
    "LABEL": None,
    "RESTART_WINDOW": None,
    "MAX_TTL": 60.0,
    # Django layer
    "LOCKED_RESPONSE": None,  # dotted path or callable (request, error) -> HttpResponse
    "COMMAND_TTL": 60.0,
    "HOOKS": [],  # more hooks (dotted paths, or Hooks instances): metrics exporters, your own
    "PROBLEM_TYPE_BASE": None,  # the page describing the problem types; None: "type" is about:blank
}

# REDLOCK key -> LockManager keyword
ENGINE_KEYS = {
    "TTL": "ttl",
    "RETRY_COUNT": "retry_count",
    "RETRY_DELAY": "retry_delay",
    "RETRY_JITTER": "retry_jitter",
    "CLOCK_DRIFT_FACTOR": "clock_drift_factor",
    "NODE_TIMEOUT": "node_timeout",
    "KEY_PREFIX": "key_prefix",
    "MAX_EXTENSIONS": "max_extensions",
    "LABEL": "label",
    "RESTART_WINDOW": "restart_window",
    "MAX_TTL": "max_ttl",
}

# The Django layer's own keys, checked by the engine's rule for the argument they become.
LAYER_KEYS = {"COMMAND_TTL": "ttl"}  # a command's lock ttl
#: The settings this app reads.
NAMES = ("REDLOCK", "REDLOCK_NODES")
#: Setting names people type for ours that are too far from them for difflib.
SYNONYMS = {
    "REDLOCK_SERVERS": "REDLOCK_NODES",
    "REDLOCK_MASTERS": "REDLOCK_NODES",
    "REDLOCK_CONFIG": "REDLOCK",
    "REDLOCK_SETTINGS": "REDLOCK",
    "REDLOCK_OPTIONS": "REDLOCK",
}


def misspelt_settings() -> dict[str, str]:
    """Top-level settings that look like ours but are not one, each with what it probably meant."""
    found = {name: meant_setting(name) for name in dir(settings) if name.isupper()}
    return {name: meant for name, meant in found.items() if meant}


def meant_setting(name: str) -> str | None:
    """The setting (or ``REDLOCK`` key) a setting named ``name`` probably meant; None: not one of ours."""
    if name in NAMES:
        return None
    if name in SYNONYMS:
        return SYNONYMS[name]
    close = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.85)  # REDIS_LOCK (0.82) may be a project's own
    if close:
        return close[0]
    if not name.startswith("REDLOCK"):
        return None
    key = difflib.get_close_matches(name[len("REDLOCK_"):], DEFAULTS, n=1, cutoff=0.8)
    return f"REDLOCK[{key[0]!r}]" if key else " or ".join(NAMES)  # REDLOCK_TTL for REDLOCK = {"TTL": ...}


@lru_cache(maxsize=1)
def get_config() -> dict[str, Any]:
    """``DEFAULTS`` overlaid with ``settings.REDLOCK``; raises naming every problem at once."""
    problems = config_problems()
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
    return overlaid() or {}


def overlaid() -> dict[str, Any] | None:
    """``DEFAULTS`` overlaid with ``settings.REDLOCK`` as written, unchecked; None when that is not a dict."""
    user = getattr(settings, "REDLOCK", None) or {}
    return {**DEFAULTS, **user} if isinstance(user, Mapping) else None


def config_problems() -> list[str]:
    """Every problem with ``settings.REDLOCK`` (and a misspelt setting name), one message each."""
    problems = [
        f"settings.{name} is not a django-redlock setting; did you mean {meant}?"
        for name, meant in misspelt_settings().items()
    ]
    user = getattr(settings, "REDLOCK", None) or {}
    if not isinstance(user, Mapping):
        return [*problems, f"REDLOCK must be a dict of engine defaults; got {type(user).__name__}."]
    for key in sorted(set(user) - set(DEFAULTS), key=str):
        close = difflib.get_close_matches(str(key).upper(), DEFAULTS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(sorted(DEFAULTS))}."
        problems.append(f"REDLOCK has an unknown key {key!r}; {hint}")
    config = {**DEFAULTS, **user}
    # The engine's own rules (core.config.ARGUMENTS), each value named as the setting it came from.
    for keys in (ENGINE_KEYS, LAYER_KEYS):
        values = {argument: config[key] for key, argument in keys.items()}
        problems += check_arguments(values, {argument: f"REDLOCK['{key}']" for key, argument in keys.items()})[1]
    return problems + problem_type_base_problems(config["PROBLEM_TYPE_BASE"])


def problem_type_base_problems(base: Any) -> list[str]:
    """``REDLOCK['PROBLEM_TYPE_BASE']``: None, or an absolute URL without a fragment (each problem adds its own)."""
    if base is None:
        return []
    if isinstance(base, str) and base.isprintable() and not any(c in base for c in " #"):
        try:
            if urlsplit(base).scheme:
                return []
        except ValueError:  # an unclosed IPv6 bracket
            pass
    return [
        f"REDLOCK['PROBLEM_TYPE_BASE'] must be None or an absolute URL without '#' (the page that describes the "
        f"problem types, e.g. 'https://docs.example.com/django-redlock/json_apis.html'); got {base!r}."
    ]


def engine_options() -> dict[str, Any]:
    """Keyword arguments for :class:`~django_redlock.core.LockManager` from ``REDLOCK``."""
    config = get_config()
    return {kwarg: config[key] for key, kwarg in ENGINE_KEYS.items()}


def check_max_ttl(ttl: float | None) -> None:
    """Refuse a lock ttl above ``REDLOCK['MAX_TTL']`` (the engine enforces the same limit)."""
    limit = get_config()["MAX_TTL"]
    if ttl is not None and ttl > limit:
        raise ValueError(
            f"ttl {ttl:g} s is above REDLOCK['MAX_TTL'] ({limit:g} s, the engine's max_ttl): use a ttl of at most "
            f"{limit:g} s and let the lock be extended (auto_extend, the command watchdog), or raise MAX_TTL "
            "on every client of these nodes."
        )


def get_nodes() -> list[Any]:
    """``REDLOCK_NODES`` with ``cache:<alias>`` entries resolved to their caches' clients."""
    return [resolve_node(node, i) for i, node in enumerate(node_entries())]


def node_entries() -> list[Any]:
    """``REDLOCK_NODES`` as written, once it is a non-empty list."""
    nodes = getattr(settings, "REDLOCK_NODES", None)
    if nodes is None:
        typo = next((f" (settings.{n} is set: rename it)" for n, m in misspelt_settings().items()
                     if m == "REDLOCK_NODES"), "")
        raise ImproperlyConfigured(
            f"REDLOCK_NODES is not set{typo}. List your independent Redis masters, e.g. "
            "REDLOCK_NODES = ['redis://redis-a:6379/0', 'redis://redis-b:6379/0', 'redis://redis-c:6379/0']."
        )
    if isinstance(nodes, (str, bytes, Mapping)) or not isinstance(nodes, (list, tuple)):
        raise ImproperlyConfigured(
            f"REDLOCK_NODES must be a list of Redis URLs, dicts or 'cache:<alias>' strings; got {type(nodes).__name__}."
        )
    if not nodes:
        raise ImproperlyConfigured("REDLOCK_NODES is empty; list at least one (better: three or more) Redis masters.")
    return list(nodes)


def resolve_node(node: Any, index: int) -> Any:
    """One ``REDLOCK_NODES`` entry: a URL or dict as it is, ``cache:<alias>`` (alone, or as a dict's
    ``URL``: ``{"URL": "cache:<alias>", "FSYNC_ALWAYS": True}``) as that cache's client."""
    where = f"REDLOCK_NODES[{index}]"
    if isinstance(node, str):
        alias = cache_alias(node, where)
        return node if alias is None else cache_client(alias, index)
    if isinstance(node, Mapping):
        url = node.get("URL")
        alias = cache_alias(url, where) if isinstance(url, str) else None
        if alias is None:
            return node
        if node.get("OPTIONS"):
            raise ImproperlyConfigured(
                f"{where} has 'URL': 'cache:{alias}' and 'OPTIONS'; a cache node connects as the cache does: "
                f"set connection options in CACHES[{alias!r}]['OPTIONS'] (or give a Redis URL with 'OPTIONS')."
            )
        return {**node, "URL": cache_client(alias, index)}
    raise ImproperlyConfigured(
        f"{where} must be a Redis URL, a dict with 'URL' (and 'OPTIONS'), or 'cache:<alias>'; "
        f"got {type(node).__name__}."
    )


def cache_alias(text: str, where: str) -> str | None:
    """The alias ``cache:<alias>`` names, None for a URL; a near miss (``cahce:x``, ``Cache:x``, a
    bare alias) is refused with the entry it probably meant."""
    head, colon, alias = text.partition(":")
    if "@" in text:  # a URL with credentials (a user named 'cache' too): nothing of it is shown
        return None
    if not colon:
        if text in getattr(settings, "CACHES", {}):
            raise ImproperlyConfigured(f"{where} is {text!r}, a CACHES alias; did you mean 'cache:{text}'?")
        return None
    if not difflib.get_close_matches(head.lower(), ["cache"], n=1, cutoff=0.75):
        return None
    if head == "cache" and not alias.startswith("/"):
        return alias
    if head != "cache" and alias.split("/")[0].isdigit():
        return None  # 'cacher:6379': a host and a port
    meant, known = _aliases(alias.lstrip("/"))
    raise ImproperlyConfigured(f"{where} is {text!r}; did you mean 'cache:{meant}'? (CACHES aliases: {known})")


def _host_hint(alias: str) -> str:
    """For ``cache:6379``: the URL it means if ``cache`` is a host's name, not a Django cache."""
    if not alias.split("/")[0].isdigit():
        return ""
    return f"; for a Redis server at the host 'cache', write 'redis://cache:{alias}{'' if '/' in alias else '/0'}'"


def _aliases(alias: str) -> tuple[str, str]:
    """The CACHES alias ``alias`` probably meant (itself when it is one), and every alias, for a message."""
    caches = [str(name) for name in getattr(settings, "CACHES", {})]
    close = [alias] if alias in caches else difflib.get_close_matches(alias, caches, n=1)
    return (close[0] if close else alias), ", ".join(repr(name) for name in sorted(caches)) or "none"


def cache_client(alias: str, index: int) -> Any:
    """The client behind a Redis or Valkey cache (its pool settings, no second config): Django's
    own RedisCache, django-redis, or django-valkey (sync or asyncio); a ``SentinelClient``'s
    write client follows the master its Sentinels name."""
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        meant, known = _aliases(alias)
        guess = f"; did you mean 'cache:{meant}'?" if meant != alias else ""
        raise ImproperlyConfigured(
            f"REDLOCK_NODES[{index}] is 'cache:{alias}' but CACHES has no alias {alias!r}{guess} "
            f"(CACHES aliases: {known}){_host_hint(alias)}."
        )
    import inspect

    from django.core.cache import caches as django_caches
    from django.core.cache.backends.redis import RedisCache

    from django_redlock.core.node_spec import ENCODE_HINT, credentials_cut, shown_url

    where = f"REDLOCK_NODES[{index}] is 'cache:{alias}', but CACHES[{alias!r}]"
    location = caches[alias].get("LOCATION")
    for url in [location] if isinstance(location, str) else location or []:
        if isinstance(url, str) and credentials_cut(url):
            raise ImproperlyConfigured(
                f"{where} has LOCATION {shown_url(url)!r}, with an '@' after its host: {ENCODE_HINT}."
            )
    cache = django_caches[alias]
    get_client: Any
    if isinstance(cache, RedisCache):  # Django's own Redis backend
        servers, get_client = getattr(cache, "_servers", []), cache._cache.get_client
    else:  # django-redis, django-valkey
        client = getattr(cache, "client", None)
        get_client = getattr(client, "get_client", None)
        servers = getattr(client, "_server", None) or []
        factory = getattr(client, "connection_factory", None)
        if inspect.iscoroutinefunction(get_client) and factory is not None and servers:
            # django-valkey's asyncio cache hands out clients in a coroutine: build its pool as it does.
            def get_client(write: bool, factory: Any = factory, server: Any = servers[0]) -> Any:
                pool = factory.get_or_create_connection_pool(factory.make_connection_params(server))
                return factory.base_client_cls(connection_pool=pool)
    if get_client is None or inspect.iscoroutinefunction(get_client):
        raise ImproperlyConfigured(
            f"REDLOCK_NODES[{index}] is 'cache:{alias}', but that cache is not a Redis cache "
            f"(BACKEND = {caches[alias].get('BACKEND')!r}); use 'django.core.cache.backends.redis.RedisCache', "
            "'django_redis.cache.RedisCache', 'django_valkey.cache.ValkeyCache' or a URL."
        )
    if len(servers) > 1 and "Sentinel" not in type(getattr(cache, "client", None)).__name__:
        raise ImproperlyConfigured(
            f"REDLOCK_NODES[{index}]: cache {alias!r} lists {len(servers)} servers (a primary and replicas); "
            "Redlock needs one independent master per node. Use one cache alias per master."
        )
    failed = None
    try:
        return get_client(write=True)
    except Exception as exc:  # noqa: BLE001 - the client library's text may quote the LOCATION, password and all
        failed = type(exc).__name__
    raise ImproperlyConfigured(
        f"{where} could not make its client ({failed}): check its LOCATION and OPTIONS; {ENCODE_HINT}."
    )


#: The settings a lock manager is built from: a change clears the cache here, and
#: :mod:`django_redlock.manager` forgets the managers built from them.
SETTINGS = ("REDLOCK", "REDLOCK_NODES", "CACHES")


@receiver(setting_changed)
def _reset(setting: str, **kwargs: Any) -> None:
    if setting in SETTINGS or meant_setting(setting):
        get_config.cache_clear()
