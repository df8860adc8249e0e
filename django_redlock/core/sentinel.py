"""A Sentinel-managed master as one node: its Sentinels, the master they name, and how the node follows it.

A node spec ``{"SENTINELS": [(host, port), ...], "SERVICE": name, "OPTIONS": {...},
"SENTINEL_OPTIONS": {...}}`` (or a redis-py or valkey-py client whose pool is a Sentinel pool,
as django-redis's and django-valkey's ``SentinelClient`` make) becomes a
:class:`~django_redlock.core.node_spec.NodeConfig` with a :class:`SentinelGroup`. Each new
connection asks the Sentinels for the master first (a majority must name it); an idle connection
is used only while the Sentinels, asked again at most every :data:`RECHECK` seconds, still name
the server it goes to.

A promotion sits the node out as a failover does (the new master may lack the last locks
written: replication is asynchronous). Three things tell it: the master's run id and
replication state differ from what this process saw before (see
:func:`~django_redlock.core.ledger.moved`), the Sentinels name another address than before,
and, for a process that saw nothing before, Sentinel's ``role-reported-time`` (how long ago it
took this server for the master; a restarted Sentinel says "just now", which fails closed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock.core import clock, forks
from django_redlock.core.books import NodeUnavailable
from django_redlock.core.node_spec import NodeConfig, _handshake_off, _init_params, declared_fsync, describe, unknown_key
from django_redlock.core.records import printable

__all__ = ["RECHECK", "SPEC_KEYS", "SentinelGroup", "from_dict", "from_pool", "is_sentinel_pool", "node_from"]

#: An idle connection is used only if the Sentinels, asked at most this often, still name its server.
RECHECK = 1.0
#: The keys of a Sentinel node's dict in ``REDLOCK_NODES``.
SPEC_KEYS = ("SENTINELS", "SERVICE", "OPTIONS", "SENTINEL_OPTIONS", "FSYNC_ALWAYS")
#: OPTIONS a Sentinel node cannot take: the Sentinels say where the master is.
_PLACED = ("host", "port", "path", "unix_socket_path", "url")

N = TypeVar("N", bound=NodeConfig)


class SentinelGroup:
    """The Sentinels that name one service's master, and what this process last heard from them."""

    def __init__(
        self, sentinels: Sequence[tuple[str, int]], service: str, options: Mapping[str, Any], timeout: float
    ) -> None:
        self.sentinels = list(sentinels)
        self.service = service
        self.timeout = timeout
        kwargs = {k: v for k, v in options.items() if k not in ("retry", "retry_on_error", "retry_on_timeout")}
        kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
        accepted = _init_params(redis.Redis)
        kwargs.update({k: v for k, v in _handshake_off(redis.Connection).items() if k in accepted})
        self.kwargs = kwargs
        self.secrets = [str(options[k]) for k in ("password", "ssl_password") if options.get(k)]
        #: Two entries of ``REDLOCK_NODES`` with one service and one Sentinel are one master.
        self.key = f"sentinel:{service}@{min(_address(s) for s in self.sentinels)}"
        #: The master's address the Sentinels named last (None: not asked yet), and when.
        self.address: tuple[str, int] | None = None
        self.checked = -1e18
        self._checking = forks.mutex(self, "_checking")

    def name(self, db: int) -> str:
        return f"sentinel:{_address(self.sentinels[0])}/{self.service}/{db}"

    def due(self, now: float) -> bool:
        """Whether idle connections wait for the Sentinels to be asked again (see :data:`RECHECK`)."""
        return now - self.checked >= RECHECK

    def current(self, host: Any, port: Any) -> bool:
        """Whether a connection to ``host:port`` goes to the master the Sentinels named last."""
        return self.address is None or (host, int(port)) == self.address

    # -- asking ---------------------------------------------------------------------

    def follow(self, node: NodeConfig) -> dict[str, Any]:
        """Ask every Sentinel for the master: ``{"host", "port"}`` to connect to, once a majority of
        them name the same one (a lone Sentinel, cut off with the old master, keeps naming it).
        Raises :class:`NodeUnavailable` naming why."""
        problems: list[str] = []
        named: list[tuple[str, int, float | None]] = []
        for sentinel in list(self.sentinels):
            try:
                with redis.Redis(host=sentinel[0], port=sentinel[1], **self.kwargs) as client:
                    state = cast(Any, client).execute_command("SENTINEL", "MASTER", self.service)
            except Exception as exc:  # noqa: BLE001 - any failure: the next Sentinel
                problems.append(f"{_address(sentinel)}: {self._why(exc)}")
                continue
            self._heard(sentinel, state, named, problems)
        return self._agreed(node, named, problems)

    async def afollow(self, node: NodeConfig) -> dict[str, Any]:
        """:meth:`follow` on the running event loop."""
        import redis.asyncio as aredis

        problems: list[str] = []
        named: list[tuple[str, int, float | None]] = []
        for sentinel in list(self.sentinels):
            client = aredis.Redis(host=sentinel[0], port=sentinel[1], **_async_kwargs(self.kwargs))
            try:
                state = await cast(Any, client).execute_command("SENTINEL", "MASTER", self.service)
            except Exception as exc:  # noqa: BLE001 - any failure: the next Sentinel
                problems.append(f"{_address(sentinel)}: {self._why(exc)}")
                continue
            finally:
                try:
                    await client.aclose()
                except Exception:  # noqa: BLE001
                    pass
            self._heard(sentinel, state, named, problems)
        return self._agreed(node, named, problems)

    def _heard(self, sentinel: tuple[str, int], state: Any, named: list[Any], problems: list[str]) -> None:
        found = self._judge(state)
        if isinstance(found, str):
            problems.append(f"{_address(sentinel)}: {found}")
        else:
            named.append(found)

    def _agreed(
        self, node: NodeConfig, named: list[tuple[str, int, float | None]], problems: list[str]
    ) -> dict[str, Any]:
        """The master a majority of the Sentinels named (the most recent promotion any of them saw)."""
        for host, port, _ in named:
            same = [age for h, p, age in named if (h, p) == (host, port)]
            if len(same) > len(self.sentinels) // 2:
                ages = [age for age in same if age is not None]
                return self._learned(node, host, port, min(ages) if ages else None)
        if named:
            masters = sorted({f"{printable(h)}:{p}" for h, p, _ in named})
            problems.append(f"{len(self.sentinels) // 2 + 1} of {len(self.sentinels)} must name one master; "
                            f"named: {', '.join(masters)}")
        raise NodeUnavailable(node.redact(self._none(problems)))

    def recheck(self, node: NodeConfig) -> None:
        """Ask again if it is time (one thread at a time); when no Sentinel answers, the
        connections already open stay in use: without Sentinels there is no failover either."""
        if not self._checking.acquire(blocking=False):
            return
        try:
            if self.due(clock.now()):
                self.follow(node)
        except NodeUnavailable:
            self.checked = clock.now()
        finally:
            self._checking.release()

    async def arecheck(self, node: NodeConfig) -> None:
        """:meth:`recheck` on the running event loop."""
        if not self.due(clock.now()):
            return
        self.checked = clock.now()  # one coroutine at a time asks
        try:
            await self.afollow(node)
        except NodeUnavailable:
            pass

    def _judge(self, state: Any) -> tuple[str, int, float | None] | str:
        """The master a Sentinel named (host, port, seconds since it took it for the master), or why not."""
        try:
            state = _fields(state)
            flags = set(state["flags"].split(","))
            if "master" not in flags:
                return "no master for the service"
            if flags & {"s_down", "o_down"}:
                return f"sees the master {printable(str(state['ip']))}:{printable(str(state['port']))} down"
            host, port = str(state["ip"]), int(state["port"])
        except (KeyError, TypeError, ValueError):
            return "unexpected reply to SENTINEL MASTER"
        try:
            age: float | None = int(state["role-reported-time"]) / 1000
        except (KeyError, TypeError, ValueError):
            age = None
        return host, port, age

    def _learned(self, node: NodeConfig, host: str, port: int, age: float | None) -> dict[str, Any]:
        """Note the master named: another address than before, or one that became the master less
        than a restart window ago, sits the node out as a failover does."""
        now = clock.now()
        before, self.address, self.checked = self.address, (host, port), now
        node.host, node.port = host, port
        if before is not None and before != self.address:
            node.history.replaced(now)
        if age is not None:
            node.history.replaced(now - age)
        return {"host": host, "port": port}

    def _why(self, exc: BaseException) -> str:
        text = str(exc)
        if isinstance(exc, redis.ResponseError) and "No such master" in text:
            return f"does not monitor {printable(self.service)!r}"
        return describe(exc, self.timeout)

    def _none(self, problems: list[str]) -> str:
        return f"no Sentinel named a master for {printable(self.service)!r} ({'; '.join(problems)})"


def _address(sentinel: tuple[str, int]) -> str:
    host = str(sentinel[0])
    return f"[{host}]:{sentinel[1]}" if ":" in host else f"{host}:{sentinel[1]}"


def _async_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    from redis.asyncio.retry import Retry as AsyncRetry

    return {**kwargs, "retry": AsyncRetry(NoBackoff(), 0)}


# -- node specs ------------------------------------------------------------------------------


def _sentinels(value: Any, where: str) -> list[tuple[str, int]]:
    expected = "a list of (host, port) pairs, e.g. [('sentinel-a', 26379), ('sentinel-b', 26379)]"
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)) or not value:
        got = "an empty list" if isinstance(value, (list, tuple)) else type(value).__name__
        raise ValueError(f"{where}: 'SENTINELS' must be {expected}; got {got}.")
    found = []
    for item in value:
        if isinstance(item, str) and item.rpartition(":")[2].isdigit():
            item = (item.rpartition(":")[0].strip("[]"), int(item.rpartition(":")[2]))
        ok = isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str) and item[0]
        if not ok or isinstance(item[1], bool) or not isinstance(item[1], int) or not 0 < item[1] < 65536:
            raise ValueError(f"{where}: 'SENTINELS' must be {expected}; got the entry {printable(repr(item))[:80]}.")
        found.append((item[0], item[1]))
    return found


def _options(value: Any, where: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: {key!r} must be a dict of redis-py connection options; got {type(value).__name__}.")
    return dict(value)


def node_from(spec: Any, node_timeout: float, where: str, make: type[N]) -> N | None:
    """``spec`` as a Sentinel node: a dict with ``SENTINELS``, or a client whose pool is a Sentinel
    pool (django-redis's and django-valkey's ``SentinelClient``); None: it is not one."""
    pool = getattr(spec, "connection_pool", None)
    if is_sentinel_pool(pool):
        return from_pool(pool, node_timeout, where, make)
    if isinstance(spec, Mapping) and "SENTINELS" in spec:
        return from_dict(spec, node_timeout, where, make)
    return None


def from_dict(spec: Mapping[str, Any], node_timeout: float, where: str, make: type[N]) -> N:
    """A node from ``{"SENTINELS", "SERVICE", "OPTIONS", "SENTINEL_OPTIONS", "FSYNC_ALWAYS"}``."""
    given = dict(spec)
    unknown = [key for key in given if key not in SPEC_KEYS]
    if unknown:
        raise ValueError(
            f"{where}: " + "; ".join(unknown_key(key, SPEC_KEYS) for key in unknown) + " in a Sentinel node "
            "('SENTINELS', 'SERVICE' and optional 'OPTIONS' (the master's), 'SENTINEL_OPTIONS' (the Sentinels' own), "
            "'FSYNC_ALWAYS')."
        )
    sentinels = _sentinels(given.get("SENTINELS"), where)
    service = given.get("SERVICE")
    if not isinstance(service, str) or not service:
        raise ValueError(f"{where}: 'SERVICE' must be the master's name as the Sentinels monitor it (a string).")
    options = _options(given.get("OPTIONS"), where, "OPTIONS")
    sentinel_options = _options(given.get("SENTINEL_OPTIONS"), where, "SENTINEL_OPTIONS")
    fsync_always = declared_fsync(given.get("FSYNC_ALWAYS", False), where)
    for key, given_options in (("OPTIONS", options), ("SENTINEL_OPTIONS", sentinel_options)):
        placed = sorted(k for k in given_options if k in _PLACED)
        if placed:
            raise ValueError(
                f"{where}: {key!r} of a Sentinel node cannot set {placed}: 'SENTINELS' lists the Sentinels, "
                "and they name the master."
            )
    secrets = [str(o.get(k)) for o in (options, sentinel_options) for k in ("password", "ssl_password") if o.get(k)]
    problem = _problem(sentinel_options, secrets)
    if problem is not None:
        raise ValueError(f"{where}: invalid 'SENTINEL_OPTIONS': {problem}")
    connection_class = redis.SSLConnection if options.pop("ssl", False) else redis.Connection
    group = SentinelGroup(sentinels, service, sentinel_options, node_timeout)
    try:
        return make(connection_class, options, node_timeout=node_timeout, fsync_always=fsync_always, sentinel=group)
    except ValueError as exc:  # options redis-py refuses (already redacted): say which entry
        raise ValueError(f"{where}: {exc}") from None


def _problem(options: Mapping[str, Any], secrets: Sequence[str]) -> str | None:
    """Why redis-py refuses these Sentinel options (no secret in it), None: it takes them."""
    try:
        redis.Redis(host="localhost", port=26379, **options)
    except (TypeError, ValueError, redis.RedisError) as exc:
        text = str(exc)
        for secret in secrets:
            text = text.replace(secret, "***")
        return text
    return None


def is_sentinel_pool(pool: Any) -> bool:
    """A redis-py or valkey-py pool of a Sentinel-managed service (django-redis's and django-valkey's ``SentinelClient``)."""
    return hasattr(pool, "service_name") and hasattr(pool, "sentinel_manager")


#: Sentinel-managed connection classes of redis-py and valkey-py (sync and asyncio), by name.
_MANAGED = {"SentinelManagedConnection": redis.Connection, "SentinelManagedSSLConnection": redis.SSLConnection}


def from_pool(pool: Any, node_timeout: float, where: str, make: type[N]) -> N:
    """A node from a client's Sentinel connection pool: the same service, Sentinels, passwords and TLS."""
    proxy = pool.connection_kwargs.get("connection_pool")  # what its connections ask: master or replicas
    if not getattr(proxy, "is_master", getattr(pool, "is_master", True)):
        raise ValueError(
            f"{where}: this client's pool is for the replicas of {printable(str(pool.service_name))!r}; "
            "a node is the master: use the cache's write client (is_master=1)."
        )
    name = getattr(pool, "connection_class", type(None)).__name__
    connection_class = _MANAGED.get(name)
    if connection_class is None:
        raise ValueError(f"{where}: a Sentinel pool with {name} connections cannot be a node.")
    accepted = _init_params(connection_class)
    skip = {"connection_pool", "host", "port", "retry", "retry_on_error", "parser_class", "cache", "cache_config",
            "event_dispatcher", "lib_name", "lib_version", "driver_info"}
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in skip}
    sentinels, sentinel_options = [], {}
    for client in pool.sentinel_manager.sentinels:
        settings = dict(client.connection_pool.connection_kwargs)
        sentinels.append((str(settings.pop("host", "localhost")), int(settings.pop("port", 26379))))
        if "SSL" in client.connection_pool.connection_class.__name__:  # redis-py's or valkey-py's, sync or asyncio
            settings["ssl"] = True
        sentinel_options = {k: v for k, v in settings.items() if k in _init_params(redis.Redis) and k not in skip}
    group = SentinelGroup(sentinels, str(pool.service_name), sentinel_options, node_timeout)
    try:
        return make(connection_class, kwargs, node_timeout=node_timeout, sentinel=group)
    except ValueError as exc:  # options redis-py refuses (already redacted): say which entry
        raise ValueError(f"{where}: {exc}") from None


def _fields(reply: Any) -> dict[str, str]:
    """SENTINEL MASTER's reply as text fields: RESP2 sends name, value, name, value...; RESP3 a map.
    Read here rather than by redis-py, whose parser for it changed between the versions supported."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {_text(name): _text(value) for name, value in pairs}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
