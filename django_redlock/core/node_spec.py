"""What a node is, before any connection: its settings, its name, and how its failures read.

Node specs (a URL, a redis-py or valkey-py client, or ``{"URL", "OPTIONS", "FSYNC_ALWAYS"}``
whose ``URL`` is a URL or a client) become a :class:`NodeConfig`: redis-py connection settings
built with the node timeout as socket timeout, no retries and no handshake round trips that
are not needed, with credentials kept out of every message. Both drivers build on
it (the sync :class:`~django_redlock.core.nodes.Node`, the asyncio
:class:`~django_redlock.core.anodes.AsyncNode`).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

try:
    from redis.backoff import NoBackoff
except ImportError:  # pragma: no cover - very old redis-py
    NoBackoff = None  # type: ignore[assignment,misc]

from django_redlock.core import forks, ledger, redis_internals
from django_redlock.core.records import printable

redis_internals.check()  # both drivers build on this module: an unusable redis-py fails here, named

__all__ = [
    "ENCODE_HINT",
    "SCHEMES",
    "NodeConfig",
    "NodeSpec",
    "TLSConnection",
    "TLSSetupError",
    "config_from_spec",
    "credentials_cut",
    "describe",
    "parse_specs",
    "shown_url",
]

SCHEMES = ("redis", "rediss", "unix")

NodeSpec = Any  # str URL | redis.Redis | valkey.Valkey | Mapping with "URL"/"OPTIONS"


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _handshake_off(connection_class: type) -> dict[str, Any]:
    """Keyword arguments that stop redis-py's optional round trips on connect."""
    params = _init_params(connection_class)
    off: dict[str, Any] = {}
    if "driver_info" in params:
        off["driver_info"] = None
    elif "lib_name" in params:
        off.update(lib_name=None, lib_version=None)
    if "maint_notifications_config" in params:
        try:  # redis-py 7+ (older ones have no such module, nor the parameter)
            from redis.maint_notifications import MaintNotificationsConfig  # type: ignore[import-not-found,unused-ignore]

            off["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
        except ImportError:  # pragma: no cover
            pass
    return off


def _display_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    # Credentials sit in the path of a URL missing a slash ("redis:/:pw@host"): mask them there too.
    rest = parts.netloc + parts.path
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return f"{parts.scheme}://{rest}"


def _hide(text: str) -> str:
    """``text`` with any credentials (up to the last ``@``) hidden."""
    return "***@" + text.rsplit("@", 1)[1] if "@" in text else text


_SCHEME_START = re.compile(r"(rediss?|unix)(:?)(/*)(.*)", re.DOTALL)


def _meant(url: str) -> str | None:
    """The URL a node URL without a usable scheme probably meant (credentials hidden), None: no guess."""
    found = _SCHEME_START.fullmatch(url)
    if found:
        scheme, colon, slashes, rest = found.groups()
        host_named_like_scheme = colon and not slashes and rest.isdigit()  # 'redis:6379': host redis, port 6379
        if (colon or slashes) and not host_named_like_scheme:
            if not rest or (colon, slashes) == (":", "//"):
                return None
            return f"{scheme}:///{_hide(rest)}" if scheme == "unix" else f"{scheme}://{_hide(rest)}"
    bare = _hide(url)
    _, colon, port = bare.split("/", 1)[0].rsplit("@", 1)[-1].rpartition(":")
    if colon and not port.isdigit():
        return None  # 'word:word' is no host and port: no address to guess
    return f"redis://{bare}" + ("" if "/" in bare else "/0")


#: How a password with a character URLs reserve is written in a node URL.
ENCODE_HINT = (
    "percent-encode a password with '/', '?', '#' or '@' (urllib.parse.quote(password, safe=''): '#' is %23), "
    "or give it in OPTIONS"
)


def credentials_cut(url: str) -> bool:
    """True when an ``@`` comes after the URL's authority ends: a password with an unencoded ``/``,
    ``?`` or ``#`` cut it short, and its head would be read as a host or a port."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return bool(authority) and "@" not in authority and "@" in rest


def shown_url(url: str) -> str:
    """``url`` as messages show it: nothing before its last ``@``."""
    if "@" not in url:
        return url
    scheme = url.split("://", 1)[0] + "://" if "://" in url else ""
    return f"{scheme}***@{url.rsplit('@', 1)[1]}"


def _check_url(url: str, where: str) -> None:
    """Refuse a URL that is not a node's address; no message holds text before its last ``@``.

    Messages are built outside ``except`` blocks: an exception chained to them (which a
    traceback prints) could hold the password."""
    if url.lower().startswith("cache:") and "@" not in url:
        raise ValueError(
            f"{where}: {url!r} names a Django cache, which only REDLOCK_NODES in Django settings resolves; "
            "give the engine a Redis URL or the cache's client."
        )
    if "://" not in url and not url.startswith(tuple(f"{scheme}:" for scheme in SCHEMES)):
        meant = _meant(url)
        guess = f"; did you mean {meant!r}?" if meant else "; expected redis://host:port/db, rediss:// or unix://."
        raise ValueError(f"{where}: {_hide(url)!r} has no scheme{guess}")
    if credentials_cut(url):
        raise ValueError(
            f"{where}: the Redis URL {shown_url(url)!r} has an '@' after its host: {ENCODE_HINT} "
            "(an '@' in the query is %40)."
        )
    shown = _display_url(url)
    problem = None
    try:
        parts = urlsplit(url)
    except ValueError:
        problem = "it cannot be parsed"
    else:
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            problem = "its port is not a number from 0 to 65535"
    if problem is not None:
        raise ValueError(f"{where}: malformed Redis URL {shown!r}: {problem}.")
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"{where}: unsupported scheme {parts.scheme!r} in {shown!r}; expected one of redis://, rediss://, unix://."
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"{where}: unix:// URL {shown!r} has no socket path.")
    elif not parts.hostname:
        meant = _meant(url) if not parts.netloc else None
        if meant is None:
            raise ValueError(f"{where}: Redis URL {shown!r} has no host.")
        raise ValueError(f"{where}: Redis URL {_hide(url)!r} has no host; did you mean {meant!r}?")


def _name_from_kwargs(kwargs: Mapping[str, Any]) -> str:
    path = kwargs.get("path")
    db = int(kwargs.get("db") or 0)
    if path:
        return f"unix:{path}" + (f"/{db}" if db else "")
    host = kwargs.get("host", "localhost")
    port = kwargs.get("port", 6379)
    if ":" in str(host):
        host = f"[{host}]"
    return f"{host}:{port}/{db}"


class TLSSetupError(Exception):
    """The node's TLS context could not be built (a CA or certificate file unreadable or not PEM)."""


class TLSConnection(redis.SSLConnection):
    """redis-py's TLS connection over the context its node built once (:meth:`NodeConfig.tls_context`).

    redis-py builds a new context, parsing the whole CA store, for every connection: tens of
    milliseconds of the client's own CPU, counted against the node's connect timeout.
    """

    context: ssl.SSLContext | None = None

    def _connect(self) -> Any:
        if self.context is None:
            return super()._connect()  # type: ignore[no-untyped-call]
        sock = redis.Connection._connect(self)  # type: ignore[no-untyped-call]  # TCP, within the connect timeout
        try:
            return self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise


#: Options that verify the certificate per connection (OCSP): those nodes keep redis-py's own TLS.
_OCSP = ("ssl_validate_ocsp", "ssl_validate_ocsp_stapled", "ssl_ocsp_context", "ssl_ocsp_expected_cert")
#: The files a TLS context reads, as the messages name them.
_TLS_FILES = (("ssl_ca_certs", "CA file"), ("ssl_ca_path", "CA directory"), ("ssl_certfile", "certificate file"),
              ("ssl_keyfile", "key file"))


def _tls_context(kwargs: Mapping[str, Any]) -> ssl.SSLContext:
    """A context as redis-py builds it for these ``ssl_*`` settings (its asyncio builder, which keeps it)."""
    from redis.asyncio.connection import SSLConnection as AsyncSSLConnection

    accepted = _init_params(AsyncSSLConnection)
    settings = {k: v for k, v in kwargs.items() if k.startswith("ssl_") and k in accepted}
    try:
        return AsyncSSLConnection(**settings).ssl_context.get()
    except (OSError, ValueError, redis.RedisError) as exc:
        failure = exc
    raise TLSSetupError(_unreadable(kwargs) or f"TLS settings not usable ({_ssl_reason(failure)})")


def _unreadable(kwargs: Mapping[str, Any]) -> str | None:
    for key, label in _TLS_FILES:
        path = kwargs.get(key)
        if path and not os.access(path, os.R_OK):
            why = "permission denied" if os.path.exists(path) else "no such file"
            return f"{label} {path} could not be read ({why})"
    return None


def _ssl_reason(exc: BaseException) -> str:
    """The client's reason for a TLS failure (OpenSSL's words; no secret in them)."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return str(exc.verify_message).rstrip(".")
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else exc.__class__.__name__


class NodeConfig:
    """One independent Redis master's connection settings, name and restart history (no connections)."""

    def __init__(
        self,
        connection_class: type,
        connection_kwargs: Mapping[str, Any],
        *,
        node_timeout: float,
        name: str | None = None,
        fsync_always: bool = False,
        sentinel: Any = None,
    ) -> None:
        kwargs = dict(connection_kwargs)
        secrets = [str(kwargs.get("password") or ""), str(kwargs.get("ssl_password") or "")]
        #: A :class:`~django_redlock.core.sentinel.SentinelGroup`: its Sentinels name the master to connect to.
        self.sentinel = sentinel
        if sentinel is not None:
            secrets += sentinel.secrets
            name = name or sentinel.name(int(kwargs.get("db") or 0))
        if connection_class is redis.SSLConnection and not any(kwargs.get(k) for k in _OCSP):
            connection_class = TLSConnection
        kwargs.update(
            socket_timeout=node_timeout,
            socket_connect_timeout=node_timeout,
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )
        kwargs.pop("retry_on_error", None)
        # RESP2: no HELLO round trip on connect, and the reply shapes the engine reads.
        kwargs["protocol"] = 2
        if "RESP3" in getattr(kwargs.get("parser_class"), "__name__", ""):
            kwargs.pop("parser_class")
        if NoBackoff is not None:
            kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs.update(_handshake_off(connection_class))
        self.connection_class = connection_class
        self.kwargs = kwargs
        self.name = name or _name_from_kwargs(kwargs)
        self.host = kwargs.get("host") if not kwargs.get("path") else None
        self.port = kwargs.get("port") if not kwargs.get("path") else None
        self.path = kwargs.get("path")
        self.db = int(kwargs.get("db") or 0)
        self.node_timeout = node_timeout
        self._fsync_always = bool(fsync_always)
        #: What this process learned of the server at this address, kept across forks and shared
        #: by every manager and the asyncio books (a failover is noticed whoever probes first).
        address = self.path or (f"{self.host}:{self.port}" if self.host else self.name)
        self.history = ledger.history_for(address if sentinel is None else sentinel.key)  # a group: one history
        self._secrets = [s for s in secrets if s]
        self._tls: ssl.SSLContext | None = None
        self._tls_lock = forks.mutex(self, "_tls_lock")
        problem: str | None = None
        try:
            connection_class(**kwargs)  # fail now on bad options, not on the first lock
        except (TypeError, ValueError, redis.RedisError) as exc:  # RedisError: e.g. a bad ssl_cert_reqs
            problem = self.redact(str(exc))
        if problem is not None:
            raise ValueError(f"node {self.name}: invalid connection options: {problem}")
        self._configured()

    @property
    def tls_pending(self) -> bool:
        """A TLS node whose context is not built yet (the next connection builds it)."""
        return self._tls is None and self.connection_class is TLSConnection

    def tls_context(self) -> ssl.SSLContext | None:
        """This node's TLS context, built on first use and then shared by every connection of both
        drivers; None for a node without TLS. Raises :class:`TLSSetupError`.

        Call it before a connect's timer starts: building it is the client's CPU, not the node's time.
        """
        if self.tls_pending:
            with self._tls_lock:
                if self._tls is None:
                    self._tls = _tls_context(self.kwargs)
        return self._tls

    def new_connection(self) -> Any:
        """A redis-py connection to this node, not connected yet (over the node's TLS context)."""
        kwargs = self.kwargs if self.sentinel is None else {**self.kwargs, **self.sentinel.follow(self)}
        conn = self.connection_class(**kwargs)
        if self.connection_class is TLSConnection:
            conn.context = self.tls_context()
        return conn

    def _configured(self) -> None:
        """What a driver's node adds once the settings are known (its connections' books)."""

    @classmethod
    def follower(cls: type[N], spec: NodeSpec, node_timeout: float, where: str) -> N | None:
        """``spec`` as a node that follows a master named elsewhere (the drivers' nodes read Sentinel
        entries: :mod:`~django_redlock.core.sentinel`); None: ``spec`` is not one."""
        return None

    @property
    def fsync_always(self) -> bool:
        """Declared to fsync every write: votes at once after a restart (still probed: a failover is not a restart)."""
        return self._fsync_always

    @fsync_always.setter
    def fsync_always(self, value: bool) -> None:
        self._fsync_always = bool(value)

    def __repr__(self) -> str:
        return f"<Node {self.name}>"

    def redact(self, text: str) -> str:
        return _redact(text, self._secrets)


N = TypeVar("N", bound=NodeConfig)


def parse_specs(specs: Any, node_timeout: float, argument: str, make: type[N]) -> list[N]:
    """Turn URLs, redis-py or valkey-py clients or ``{"URL", "OPTIONS"}`` mappings into nodes."""
    if isinstance(specs, (str, bytes)) or not isinstance(specs, (Sequence, set, frozenset, tuple)):
        if isinstance(specs, Mapping) or isinstance(specs, (str, bytes)) or isinstance(specs, redis.Redis):
            raise ValueError(f"{argument} must be a list of nodes, not a single {type(specs).__name__}.")
        raise ValueError(f"{argument} must be a list of Redis URLs, clients or dicts; got {type(specs).__name__}.")
    specs = list(specs)
    if not specs:
        raise ValueError(f"{argument} is empty; Redlock needs at least one Redis master (three or more to be useful).")
    return [config_from_spec(spec, node_timeout, f"{argument}[{i}]", make) for i, spec in enumerate(specs)]


def config_from_spec(spec: NodeSpec, node_timeout: float, where: str, make: type[N]) -> N:
    """One node spec as ``make`` (a :class:`NodeConfig` class); an instance of it is taken as is."""
    if isinstance(spec, make):
        return spec
    found = make.follower(spec, node_timeout, where)  # a Sentinel entry, or a client on a Sentinel pool
    if found is not None:
        return found
    options: dict[str, Any] = {}
    fsync_always = False
    if isinstance(spec, Mapping):
        spec, options, fsync_always = _entry(spec, where)
    if isinstance(spec, str):
        return _from_url(spec, options, node_timeout, where, make, fsync_always)
    if options:  # with a client as 'URL'
        raise ValueError(
            f"{where}: 'OPTIONS' cannot go with a client as 'URL': the client's own connection settings are used."
        )
    found = make.follower(spec, node_timeout, where)  # a Sentinel client as 'URL', declared FSYNC_ALWAYS or not
    if found is not None:
        found.fsync_always = fsync_always
        return found
    if isinstance(spec, redis.Redis):
        pool = spec.connection_pool
        return make(pool.connection_class, pool.connection_kwargs, node_timeout=node_timeout, fsync_always=fsync_always)
    if is_valkey_client(spec):
        connection_class, kwargs = valkey_settings(spec.connection_pool, where)
        return make(connection_class, kwargs, node_timeout=node_timeout, fsync_always=fsync_always)
    raise ValueError(
        f"{where}: expected a Redis URL string, a redis.Redis or valkey.Valkey client or a dict with 'URL'; "
        f"got {type(spec).__name__}."
    )


#: The keys of a node dict, upper-case as in Django's DATABASES and CACHES.
NODE_KEYS = ("URL", "OPTIONS", "FSYNC_ALWAYS")
#: The keys only a Sentinel node's dict has (:mod:`~django_redlock.core.sentinel`).
SENTINEL_KEYS = ("SENTINELS", "SERVICE", "SENTINEL_OPTIONS")
_YES_NO = {"yes", "no", "true", "false", "on", "off", "1", "0", "always", "never", ""}


def _entry(spec: Mapping[Any, Any], where: str) -> tuple[Any, dict[str, Any], bool]:
    """A node dict's address (a URL, or a client), ``OPTIONS`` and ``FSYNC_ALWAYS``, each checked."""
    unknown = [key for key in spec if key not in NODE_KEYS]
    if unknown:
        raise ValueError(f"{where}: " + "; ".join(unknown_key(key) for key in unknown))
    url = spec.get("URL")
    options = spec.get("OPTIONS") or {}
    fsync_always = spec.get("FSYNC_ALWAYS", False)
    if not (isinstance(url, str) or isinstance(url, redis.Redis) or is_valkey_client(url)):
        got = "it is missing" if "URL" not in spec else f"got {type(url).__name__}"
        raise ValueError(f"{where}: 'URL' must be a Redis URL string (or a redis-py or valkey-py client); {got}.")
    if not isinstance(options, Mapping):
        raise ValueError(f"{where}: 'OPTIONS' must be a dict of redis-py connection options.")
    return url, dict(options), declared_fsync(fsync_always, where)


def declared_fsync(value: Any, where: str) -> bool:
    """A node dict's ``FSYNC_ALWAYS``, checked."""
    if isinstance(value, bool):
        return value
    # A number or a word for yes or no is shown; else the type: it may be a URL or a password in the wrong key.
    plain = value is None or isinstance(value, (int, float)) or (isinstance(value, str) and value.lower() in _YES_NO)
    raise ValueError(
        f"{where}: 'FSYNC_ALWAYS' must be True or False (True: the node runs appendonly yes with "
        f"appendfsync always, so it may vote right after a restart); "
        f"got {repr(value) if plain else 'a ' + type(value).__name__}."
    )


def unknown_key(key: Any, known: Sequence[str] = NODE_KEYS) -> str:
    """An unknown node-dict key as written, with the key it probably meant."""
    close = difflib.get_close_matches(str(key).upper(), (*known, *SENTINEL_KEYS), n=1, cutoff=0.6)
    if not close:
        return f"unknown key {key!r}" + ("; expected 'URL' and optional 'OPTIONS', 'FSYNC_ALWAYS'" if known == NODE_KEYS else "")
    case = " (keys are upper-case)" if close[0] == str(key).upper() else ""
    return f"unknown key {key!r}; did you mean {close[0]!r}?{case}"


#: valkey-py's connection classes (sync and asyncio share the names) and redis-py's for the same server.
_VALKEY_CONNECTIONS = {
    "Connection": redis.Connection,
    "SSLConnection": redis.SSLConnection,
    "UnixDomainSocketConnection": redis.UnixDomainSocketConnection,
}
#: valkey-py settings that redis-py cannot use (the node sets its own parser, retries and handshake).
_VALKEY_ONLY = {
    "parser_class", "retry", "retry_on_error", "cache", "cache_config", "event_dispatcher", "lib_name", "lib_version"
}


def is_valkey_client(spec: Any) -> bool:
    """A client of valkey-py (the redis-py fork that django-valkey uses), sync or asyncio."""
    return type(spec).__module__.split(".")[0] == "valkey" and hasattr(spec, "connection_pool")


def valkey_settings(pool: Any, where: str) -> tuple[type, dict[str, Any]]:
    """A valkey-py connection pool's settings as redis-py's: the same server, password and TLS."""
    name = getattr(pool, "connection_class", type(None)).__name__
    connection_class = _VALKEY_CONNECTIONS.get(name)
    if connection_class is None:
        raise ValueError(
            f"{where}: a valkey-py client with {name} connections (a cluster) cannot be a node; "
            "Redlock needs one independent master per node: give its address."
        )
    accepted = _init_params(connection_class)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in _VALKEY_ONLY}
    return connection_class, kwargs


def _init_params(connection_class: type) -> set[str]:
    params: set[str] = set()
    for klass in getattr(connection_class, "__mro__", (connection_class,)):
        init = klass.__dict__.get("__init__")
        if init is not None:
            try:
                params.update(inspect.signature(init).parameters)
            except (TypeError, ValueError):  # pragma: no cover
                pass
    return params - {"self", "args", "kwargs"}


def _from_url(
    url: str, options: dict[str, Any], node_timeout: float, where: str, make: type[N], fsync_always: bool = False
) -> N:
    _check_url(url, where)
    problem = None
    try:
        pool = redis.ConnectionPool.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        password = urlsplit(url).password or ""
        problem = _redact(str(exc), [url, password, unquote(password), str(options.get("password") or "")])
    if problem is not None:  # raised out here: the exception chained to it may hold the password
        raise ValueError(f"{where}: invalid Redis node {_display_url(url)!r}: {problem}")
    kwargs = pool.connection_kwargs
    if "password" not in options and urlsplit(url).password:
        kwargs["password"] = unquote(urlsplit(url).password or "")
    try:
        return make(pool.connection_class, kwargs, node_timeout=node_timeout, fsync_always=fsync_always)
    except ValueError as exc:  # options redis-py refuses (already redacted): say which entry
        raise ValueError(f"{where}: {exc}") from None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _tls_failure(exc: BaseException) -> str | None:
    """Why the node's certificate was not accepted, when a TLS failure is behind ``exc``."""
    seen = 0
    found: BaseException | None = exc
    while found is not None and seen < 8:  # redis-py raises its own error with the TLS one as context
        if isinstance(found, TLSSetupError):
            return f"certificate not accepted: {found}"
        if isinstance(found, ssl.SSLCertVerificationError):
            return f"certificate not accepted: {_ssl_reason(found)}"
        if isinstance(found, ssl.SSLError) and not isinstance(found, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return f"TLS error ({_ssl_reason(found)})"
        found = found.__cause__ or found.__context__
        seen += 1
    return None


def describe(exc: BaseException, node_timeout: float) -> str:
    """A short, credential-free reason for a failed node call."""
    tls = _tls_failure(exc)
    if tls is not None:
        return tls
    if isinstance(exc, AuthenticationError) or "AUTH" in str(exc) or "WRONGPASS" in str(exc):
        return "authentication failed"
    if isinstance(exc, RedisTimeoutError) or isinstance(exc, TimeoutError):
        return f"no reply within {_ms(node_timeout)}"
    if isinstance(exc, RedisConnectionError):
        text = str(exc).lower()
        if "refused" in text or "111" in text:
            return "connection refused"
        if "closed" in text or "reset" in text:
            return "connection lost"
        if "timeout" in text or "timed out" in text:
            return f"no reply within {_ms(node_timeout)}"
        return "connection failed"
    if isinstance(exc, ResponseError):
        return "error reply: " + printable(str(exc).split("\n")[0][:120])
    if isinstance(exc, OSError):
        return f"socket error ({exc.__class__.__name__})"
    return f"error ({exc.__class__.__name__})"
