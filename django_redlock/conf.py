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
#: Setting names people type for ours.
MISSPELT = {
    "REDLOCK_NODE": "REDLOCK_NODES",
    "REDLOCK_SERVERS": "REDLOCK_NODES",
    "REDLOCK_MASTERS": "REDLOCK_NODES",
    "REDLOCK_CONFIG": "REDLOCK",
    "REDLOCK_SETTINGS": "REDLOCK",
    "REDLOCK_OPTIONS": "REDLOCK",
}


@lru_cache(maxsize=1)
def get_config() -> dict[str, Any]:
    """``DEFAULTS`` overlaid with ``settings.REDLOCK``; raises naming every problem at once."""
    problems = config_problems()
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
    return {**DEFAULTS, **(getattr(settings, "REDLOCK", None) or {})}


def config_problems() -> list[str]:
    """Every problem with ``settings.REDLOCK`` (and a misspelt setting name), one message each."""
    problems = [
        f"settings.{name} is not a django-redlock setting; did you mean {meant}?"
        for name, meant in MISSPELT.items()
        if hasattr(settings, name)
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
        typo = next((f" (settings.{n} is set: rename it)" for n, m in MISSPELT.items() if m == "REDLOCK_NODES"
                     and hasattr(settings, n)), "")
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
    """One ``REDLOCK_NODES`` entry: a URL or dict as it is, ``cache:<alias>`` as that cache's client."""
    if isinstance(node, str) and node.startswith("cache:"):
        return cache_client(node[len("cache:") :], index)
    if isinstance(node, (str, Mapping)):
        return node
    raise ImproperlyConfigured(
        f"REDLOCK_NODES[{index}] must be a Redis URL, a dict with 'URL' (and 'OPTIONS'), or 'cache:<alias>'; "
        f"got {type(node).__name__}."
    )


def cache_client(alias: str, index: int) -> Any:
    """The client behind a Redis or Valkey cache (its pool settings, no second config): Django's
    own RedisCache, django-redis, or django-valkey (sync or asyncio)."""
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ImproperlyConfigured(
            f"REDLOCK_NODES[{index}] is 'cache:{alias}' but CACHES has no alias {alias!r} "
            f"(known: {', '.join(sorted(caches)) or 'none'})."
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
    if len(servers) > 1:
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
    if setting in SETTINGS:
        get_config.cache_clear()
