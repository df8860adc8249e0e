"""System checks for the lock topology.

The default checks read settings, and ask each node once, as a lock would,
whether it answers and votes (fewer than a quorum answering; nodes that sit
out after a restart). The ones that ask more (a minority that does not
answer, replicas, one server under two addresses,
eviction policy) run with ``manage.py check --deploy`` (just those:
``--deploy --tag redlock_nodes``); ``manage.py redlock status`` shows the rest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.core.checks import Error, Info, Warning, register
from django.core.exceptions import ImproperlyConfigured

from django_redlock import conf

__all__ = ["Codes", "Hints", "Messages"]

LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
TAG = "redlock"
NODES_TAG = "redlock_nodes"


class Codes:
    SETTINGS = "django_redlock.E001"
    OPTIONS = "django_redlock.E002"
    MAX_TTL = "django_redlock.E003"
    INFO_DENIED = "django_redlock.E004"
    FEW_MASTERS = "django_redlock.W001"
    EVEN = "django_redlock.W002"
    SAME_SERVER = "django_redlock.W003"
    TIMEOUT = "django_redlock.W004"
    REPLICA = "django_redlock.W005"
    SAME_RUN_ID = "django_redlock.W006"
    EVICTION = "django_redlock.W007"
    UNREACHABLE = "django_redlock.W008"
    SAME_HOST = "django_redlock.W009"
    NOT_FSYNCING = "django_redlock.W010"
    NO_REPLICATION = "django_redlock.W011"
    SITS_OUT = "django_redlock.W012"
    SHARED_DIR = "django_redlock.W013"
    NO_ANSWER = "django_redlock.W014"
    CONFIG_REFUSED = "django_redlock.I001"
    SENTINEL_WRITES = "django_redlock.W015"
    NO_QUORUM = "django_redlock.E005"


class Messages:
    ABOVE_MAX_TTL = (
        "REDLOCK['{key}'] is {value:g} s, above REDLOCK['MAX_TTL'] ({limit:g} s): the engine refuses such a lock, "
        "and a restarted node would vote again before it expires."
    )
    SHORT_WINDOW = (
        "REDLOCK['RESTART_WINDOW'] is {value:g} s, shorter than REDLOCK['MAX_TTL'] ({limit:g} s): a restarted "
        "node could vote while a lock it forgot is still valid."
    )
    INFO_DENIED = (
        "Redlock node {node} refuses INFO to the lock user ({error}): its restart state cannot be known, "
        "so it never votes."
    )
    FEW_MASTERS = "REDLOCK_NODES lists {count} independent Redis master(s); Redlock needs at least 3 to survive a failure."
    ONE_MASTER = (
        "REDLOCK_NODES lists 1 independent Redis master: its locks exclude each other while it runs and keeps its "
        "data, and are available only while it is. After a restart it sits out RESTART_WINDOW (unless declared "
        "FSYNC_ALWAYS). A failover to a replica (asynchronous replication) may lose lock keys: the only guard then "
        "is that a failover this process notices makes the node sit out RESTART_WINDOW too (every lock fails "
        "meanwhile); one it does not notice (its first contact comes after it) is not guarded."
    )
    EVEN = "REDLOCK_NODES lists {count} masters; an even count tolerates no more failures than {lower}."
    SAME_SERVER = "REDLOCK_NODES lists the server {server} {times} times; nodes on one server fail together."
    TIMEOUT = "REDLOCK['NODE_TIMEOUT'] ({timeout} s) is large next to REDLOCK['TTL'] ({ttl} s)."
    REPLICA = "Redlock node {node} is a replica (role: {role}), not an independent master."
    SAME_RUN_ID = "Redlock nodes {nodes} are the same Redis server (same run_id) under different addresses."
    EVICTION = "Redlock node {node} has maxmemory-policy {policy}: it may evict lock keys under memory pressure."
    UNREACHABLE = "Redlock node {node} did not answer: {error}."
    SAME_HOST = "Redlock nodes {nodes} run on one host ({host}): they fail together."
    NOT_FSYNCING = (
        "Redlock node {node} is declared FSYNC_ALWAYS but runs appendonly {appendonly} with appendfsync "
        "{appendfsync}: it votes right after a restart although it may have lost locks."
    )
    NO_REPLICATION = (
        "Redlock node {node} refuses INFO replication to the lock user ({error}): a replica promoted behind "
        "its address cannot be told from a restart, so every other server seen there sits out RESTART_WINDOW."
    )
    NO_VOTES = "Only {voting} of {total} Redlock nodes can vote now, {quorum} needed: every lock fails{until} ({detail})."
    SITS_OUT = "{count} of {total} Redlock nodes sit out after a restart; locks work ({voting} vote, {quorum} needed) ({detail})."
    NO_QUORUM = "Only {answered} of {total} Redlock nodes answered, {quorum} needed: every lock fails."
    NO_ANSWER = "Only {answered} of {total} Redlock nodes answered within {timeout:g} s, {quorum} needed: every lock fails ({detail})."
    SHARED_DIR = (
        "Redlock nodes {nodes} on {host} share the data directory {dir}: a restarted node may load another's "
        "data, and if it is declared FSYNC_ALWAYS it votes at once with keys that are not its own."
    )
    CONFIG_REFUSED = (
        "CONFIG GET is refused to the lock user on {nodes}: locks work without it, but the eviction policy and "
        "persistence{untold} could not be checked."
    )
    SENTINEL_WRITES = (
        "Redlock node {node} is a Sentinel-managed master that takes writes with no replica in reach "
        "(min-replicas-to-write {value}): cut off from its replicas and Sentinels, it goes on granting locks "
        "while Sentinel promotes a replica, and this one node then votes twice."
    )


class Hints:
    ABOVE_MAX_TTL = (
        "Set REDLOCK['{key}'] to at most {limit:g} (long work extends its lock), or raise REDLOCK['MAX_TTL'] "
        "to at least {value:g} on every client of these nodes."
    )
    SHORT_WINDOW = (
        "Set REDLOCK['RESTART_WINDOW'] to at least {limit:g}, or remove it (it then follows MAX_TTL); "
        "0 turns the delayed-restart rule off and is for tests only."
    )
    INFO_DENIED = (
        "Grant '+info' and '+config|get' to the lock user (ACL SETUSER <user> +info +config|get), or, if the "
        "node really runs 'appendonly yes' with 'appendfsync always', declare it in REDLOCK_NODES as "
        "{'URL': ..., 'FSYNC_ALWAYS': True}."
    )
    FEW_MASTERS = (
        "Run at least three (five is better) redis-server processes on separate machines and list each "
        "once in REDLOCK_NODES. Replicas, Sentinel and Cluster shards are not independent masters."
    )
    EVEN = "Add or remove one master: 3 tolerates 1 failure, 5 tolerates 2."
    SAME_SERVER = "List each redis-server once; different database numbers on one server are not separate nodes."
    TIMEOUT = "Keep NODE_TIMEOUT a few milliseconds to tens of milliseconds, far below the ttl."
    REPLICA = "Point REDLOCK_NODES at masters only; Redlock does not use replication."
    SAME_RUN_ID = "Each entry must be a different redis-server process, ideally on a different machine."
    EVICTION = "Set 'maxmemory-policy noeviction' on every lock node."
    UNREACHABLE = (
        "Check the node's address, password and firewall, and with rediss:// its certificate and ssl_ca_certs; "
        "run 'manage.py redlock status'."
    )
    SAME_HOST = "In production put each master on its own machine (or at least its own failure domain)."
    NOT_FSYNCING = (
        "Run the node with 'appendonly yes' and 'appendfsync always', or remove 'FSYNC_ALWAYS' from its entry "
        "in REDLOCK_NODES (it then sits out for RESTART_WINDOW after each restart)."
    )
    LOCKED_RESPONSE = (
        "Set REDLOCK['LOCKED_RESPONSE'] to the dotted path of a function (request, error) -> HttpResponse, "
        "or remove it (a contended view then answers 423 Locked)."
    )
    NO_QUORUM = "Start the nodes that did not answer, or fix their address, password or firewall; run 'manage.py redlock status'."
    ONE_MASTER = (
        "For locks that survive the loss of a node, run at least three (five is better) independent redis-server "
        "masters and list each once in REDLOCK_NODES; for one node, see 'One managed Redis as the only node' "
        "in the deployment docs."
    )
    SHARED_DIR = "Give each redis-server its own directory: --dir <path> on its command line, or 'dir' in its redis.conf."
    CONFIG_REFUSED = (
        "On a managed service (where CONFIG is denied) check 'maxmemory-policy noeviction' and persistence in its "
        "console or parameter group; elsewhere grant '+config|get' to the lock user."
    )
    NO_REPLICATION = (
        "Grant '+info' (or at least '+info|server +info|replication') to the lock user: ACL SETUSER <user> +info."
    )
    SENTINEL_WRITES = (
        "On every server of the group set 'min-replicas-to-write 1' and 'min-replicas-max-lag' at least one second "
        "below the Sentinels' down-after-milliseconds (in seconds), and give the master two replicas; a promoted "
        "replica then sits out RESTART_WINDOW after the old master stopped taking writes."
    )


def _max_ttl_errors(config: Mapping[str, Any]) -> list[Any]:
    """Settings under which clients of the same nodes could disagree about the longest ttl."""
    limit = config["MAX_TTL"]
    errors: list[Any] = []
    for key in ("TTL", "COMMAND_TTL"):
        if config[key] > limit:
            values = {"key": key, "value": config[key], "limit": limit}
            errors.append(
                Error(Messages.ABOVE_MAX_TTL.format(**values), hint=Hints.ABOVE_MAX_TTL.format(**values), id=Codes.MAX_TTL)
            )
    window = config["RESTART_WINDOW"]
    if isinstance(window, (int, float)) and not isinstance(window, bool) and 0 < window < limit:
        values = {"value": window, "limit": limit}
        errors.append(
            Error(Messages.SHORT_WINDOW.format(**values), hint=Hints.SHORT_WINDOW.format(**values), id=Codes.MAX_TTL)
        )
    return errors


def _locked_response_errors(value: Any) -> list[Any]:
    """REDLOCK['LOCKED_RESPONSE'] resolved as a contended view resolves it: it must import and be callable."""
    if value is None:
        return []
    from django_redlock.adapters.answers import locked_handler

    name = "REDLOCK['LOCKED_RESPONSE']"
    try:
        locked_handler(value)
    except ImproperlyConfigured as exc:
        text = str(exc)
        if text.startswith("on_locked "):  # the runtime's words for a view's argument: name the setting
            text = f"{name} = {value!r} {text[len('on_locked '):]}"
        elif not text.startswith(name):
            text = f"{name} = {value!r}: {text}"
    except Exception as exc:  # noqa: BLE001 - the module raised while importing: report it, do not crash check
        text = f"{name} = {value!r} cannot be imported: {type(exc).__name__}: {exc}"
    else:
        return []
    return [Error(text, hint=Hints.LOCKED_RESPONSE, id=Codes.OPTIONS)]


def _hooks_errors(entries: Any) -> list[Any]:
    """REDLOCK['HOOKS'] resolved as the managers resolve it: each entry imports and is a Hooks."""
    from django_redlock.manager import hooks_problems

    return [Error(text, hint="Fix REDLOCK['HOOKS'].", id=Codes.OPTIONS) for text in hooks_problems(entries)]


def _servers(nodes: list[Any]) -> list[str]:
    """Each node's server; a Sentinel node's is its group (the service, and any Sentinel in common
    with another entry for it), whichever master the Sentinels name."""
    groups: list[tuple[str, set[Any], str]] = []
    found = []
    for node in nodes:
        group = node.sentinel
        if group is None:
            found.append(_server(node))
            continue
        sentinels = set(group.sentinels)
        known = next((g for g in groups if g[0] == group.service and g[1] & sentinels), None)
        if known is None:
            known = (group.service, sentinels, str(group.key))
            groups.append(known)
        known[1].update(sentinels)
        found.append(known[2])
    return found


def _server(node: Any) -> str:
    if node.path:
        return f"unix:{node.path}"
    host = str(node.host)
    if host in LOOPBACK:
        host = "localhost"
    return f"{host}:{node.port}"


def _node_errors() -> tuple[list[Any], list[Any]]:
    """The parsed nodes, and one error per bad ``REDLOCK_NODES`` entry (all of them, not the first)."""
    from django_redlock.core.nodes import node_from_spec

    try:
        entries = conf.node_entries()
    except ImproperlyConfigured as exc:
        return [], [Error(str(exc), hint="Fix REDLOCK_NODES.", id=Codes.SETTINGS)]
    nodes, errors = [], []
    for i, entry in enumerate(entries):
        try:
            nodes.append(node_from_spec(conf.resolve_node(entry, i), 0.05, f"REDLOCK_NODES[{i}]"))
        except (ImproperlyConfigured, ValueError) as exc:
            errors.append(Error(str(exc), hint="Fix REDLOCK_NODES.", id=Codes.SETTINGS))
    return nodes, errors


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Validate REDLOCK and REDLOCK_NODES and the shape of the topology (no I/O); every problem at once."""
    problems = conf.config_problems()
    errors: list[Any] = [Error(problem, hint="Fix the REDLOCK setting.", id=Codes.OPTIONS) for problem in problems]
    config = conf.overlaid() or {}
    if not problems:
        errors += _max_ttl_errors(config)
    if config:  # imported whatever else is wrong: every problem at once
        errors += _locked_response_errors(config["LOCKED_RESPONSE"]) + _hooks_errors(config["HOOKS"])
    nodes, node_errors = _node_errors()
    errors += node_errors
    if node_errors or problems:
        return errors
    servers = Counter(_servers(nodes))
    distinct = len(servers)
    if distinct == 1:
        errors.append(Warning(Messages.ONE_MASTER, hint=Hints.ONE_MASTER, id=Codes.FEW_MASTERS))
    elif distinct < 3:
        errors.append(Warning(Messages.FEW_MASTERS.format(count=distinct), hint=Hints.FEW_MASTERS, id=Codes.FEW_MASTERS))
    elif distinct % 2 == 0:
        errors.append(
            Warning(Messages.EVEN.format(count=distinct, lower=distinct - 1), hint=Hints.EVEN, id=Codes.EVEN)
        )
    for server, times in sorted(servers.items()):
        if times > 1:
            errors.append(
                Warning(Messages.SAME_SERVER.format(server=server, times=times), hint=Hints.SAME_SERVER, id=Codes.SAME_SERVER)
            )
    if config["NODE_TIMEOUT"] * 10 > config["TTL"]:
        errors.append(
            Warning(
                Messages.TIMEOUT.format(timeout=config["NODE_TIMEOUT"], ttl=config["TTL"]),
                hint=Hints.TIMEOUT,
                id=Codes.TIMEOUT,
            )
        )
    return errors


#: How long the checks wait for the nodes' answers (seconds), as ``redlock status`` does.
PROBE_TIMEOUT = 1.0


@register(TAG, NODES_TAG)
def check_votes(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Ask every node once, as a lock would, whether it votes, waiting at most :data:`PROBE_TIMEOUT`
    in all: report fewer than a quorum answering (each node that did not, and why), and nodes that
    sit out after a (re)start (delayed-restart rule), with the seconds left, and whether locks work
    meanwhile.

    A minority that does not answer is left to ``check --deploy``.
    """
    from django_redlock.core import LockManager, ledger

    nodes, bad = _node_errors()
    if bad or conf.config_problems():
        return []  # reported by check_settings
    try:
        manager = LockManager(nodes, **conf.engine_options())
    except ValueError:
        return []  # settings clients would disagree on: reported by check_settings
    try:
        statuses = manager.node_status(timeout=PROBE_TIMEOUT)
    finally:
        manager.close()
    errors: list[Any] = []
    answered = sum(1 for s in statuses if s.reachable)
    if answered < manager.quorum:
        values = {
            "answered": answered,
            "total": len(statuses),
            "quorum": manager.quorum,
            "timeout": PROBE_TIMEOUT,
            "detail": "; ".join(f"{s.name}: {s.error or 'did not answer'}" for s in statuses if not s.reachable),
        }
        errors.append(Warning(Messages.NO_ANSWER.format(**values), hint=Hints.NO_QUORUM, id=Codes.NO_ANSWER))
    sitting = [s for s in statuses if s.reachable and ledger.DELAYED_RESTART in (s.not_voting_reason or "")]
    if not sitting:
        return errors
    voting = sum(1 for s in statuses if s.votes)
    values = {
        "voting": voting,
        "total": len(statuses),
        "quorum": manager.quorum,
        "count": len(sitting),
        # as a lock's failure says it: "name: why; ..."
        "detail": "; ".join(f"{s.name}: {s.not_voting_reason or s.error or 'did not answer'}" for s in statuses if not s.votes),
    }
    if voting >= manager.quorum:
        message = Messages.SITS_OUT.format(**values)
    else:
        # Seconds until a quorum votes, if the nodes that sit out are all that is missing.
        waits = sorted([0.0] * voting + [s.sits_out_for for s in sitting])
        values["until"] = f" for {math.ceil(waits[manager.quorum - 1])} s more" if len(waits) >= manager.quorum else ""
        message = Messages.NO_VOTES.format(**values)
    return [*errors, Warning(message, hint=ledger.RESTART_ADVICE, id=Codes.SITS_OUT)]


def _config_word(reply: Any) -> str | None:
    """The value of a ``CONFIG GET name`` reply, None when it was refused or did not come."""
    if isinstance(reply, list) and len(reply) == 2:
        return _word(reply[1])
    return None


def _word(value: Any) -> str:
    """A word a node replied, as a message may show it (control characters escaped)."""
    from django_redlock.core.records import printable

    return printable(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))


#: What ``check --deploy`` asks each node, in one write (one round, one wait in all).
QUESTIONS: tuple[tuple[str, ...], ...] = (
    ("INFO", "server"),
    ("INFO", "replication"),
    ("ROLE",),
    ("CONFIG", "GET", "maxmemory-policy"),
    ("CONFIG", "GET", "appendonly"),
    ("CONFIG", "GET", "appendfsync"),
    ("CONFIG", "GET", "dir"),
    ("CONFIG", "GET", "appenddirname"),  # Redis 7+: the append-only files' directory inside dir
    ("CONFIG", "GET", "appendfilename"),  # Redis 6.2: the one append-only file inside dir
    ("CONFIG", "GET", "dbfilename"),
)


def _ask(total: int) -> Any:
    """The engine step that sends :data:`QUESTIONS` to every node: a list of replies per node (error
    replies included), or a ``Failure`` for a node that did not answer within :data:`PROBE_TIMEOUT`."""
    from django_redlock.core.steps import Fan

    return (yield Fan([QUESTIONS] * total, timeout=PROBE_TIMEOUT))


def _host(node: Any) -> str:
    return "localhost" if node.path or str(node.host) in LOOPBACK else str(node.host)


def _data_files(config: Mapping[str, str | None]) -> tuple[tuple[str, ...], set[tuple[str, ...]]] | None:
    """The file a node loads when it starts, and the files it writes, as (kind, dir, name); None
    when its CONFIG could not be read."""
    folder, dump, appendonly = config.get("dir"), config.get("dbfilename"), config.get("appendonly")
    if folder is None or dump is None or appendonly is None:
        return None
    rdb = ("rdb", folder, dump)
    if appendonly != "yes":
        return rdb, {rdb}
    aof = ("aof", folder, config.get("appenddirname") or config.get("appendfilename") or "")
    return aof, {rdb, aof}


def _shared_dirs(nodes: list[Any], configs: list[Mapping[str, str | None]], same: set[str]) -> list[Any]:
    """W013: nodes on one host of which one would load, after a restart, files another writes.
    ``same``: names of nodes that are one server listed twice (W006 says so)."""
    known = [(n, c) for n, c in zip(nodes, configs) if n.host is not None or n.path]  # a Sentinel node's master may not be
    files = {n.name: _data_files(c) for n, c in known if n.name not in same}
    groups: dict[tuple[str, str], list[str]] = {}
    for node, config in zip(nodes, configs):
        mine = files.get(node.name)
        if mine is None:
            continue
        for other in nodes:
            theirs = files.get(other.name)
            if other is node or theirs is None or _host(other) != _host(node):
                continue
            if mine[0] in theirs[1] or theirs[0] in mine[1]:
                names = groups.setdefault((_host(node), str(config.get("dir"))), [])
                names.extend(name for name in (node.name, other.name) if name not in names)
    return [
        Warning(Messages.SHARED_DIR.format(nodes=", ".join(names), host=host, dir=folder), hint=Hints.SHARED_DIR,
                id=Codes.SHARED_DIR)
        for (host, folder), names in groups.items()
    ]


@register(TAG, NODES_TAG, deploy=True)
def check_nodes(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """With ``check --deploy`` (only these: ``--deploy --tag redlock_nodes``): ask every node, all
    questions in one write, and wait at most :data:`PROBE_TIMEOUT` in all.

    Reports nodes that do not answer, nodes that refuse INFO (they cannot
    vote) or only INFO replication (failovers cannot be told from restarts),
    replicas, one server listed under two addresses (same run id), several
    nodes on one host and nodes there that share a data directory, eviction
    policies that could drop lock keys, nodes declared ``FSYNC_ALWAYS`` whose
    CONFIG says otherwise, and, once, the nodes whose CONFIG could not be read.
    """
    from django_redlock.core import LockManager
    from django_redlock.core.nodes import Failure, parse_info
    from django_redlock.core.rounds import describe_error

    nodes, bad = _node_errors()
    if bad:
        return []  # reported by check_settings
    errors: list[Any] = []
    manager = LockManager(nodes)
    try:
        replies = manager._run(_ask(len(nodes)))
    finally:
        manager.close()
    answered = sum(1 for reply in replies if not isinstance(reply, Failure))
    if answered < manager.quorum:
        counts = {"answered": answered, "total": len(nodes), "quorum": manager.quorum}
        errors.append(Error(Messages.NO_QUORUM.format(**counts), hint=Hints.NO_QUORUM, id=Codes.NO_QUORUM))
    run_ids: dict[str, list[str]] = {}
    configs: list[Mapping[str, str | None]] = []
    config_refused: list[str] = []
    for node, reply in zip(nodes, replies):
        if isinstance(reply, Failure):
            errors.append(
                Warning(Messages.UNREACHABLE.format(node=node.name, error=reply), hint=Hints.UNREACHABLE, id=Codes.UNREACHABLE)
            )
            configs.append({})
            continue
        info, repl, role, policy, appendonly, appendfsync, *place = reply
        config = {"maxmemory-policy": _config_word(policy), "appendonly": _config_word(appendonly)}
        config["appendfsync"] = _config_word(appendfsync)
        config.update(zip(("dir", "appenddirname", "appendfilename", "dbfilename"), map(_config_word, place)))
        configs.append(config)
        if any(isinstance(r, Exception) for r in (policy, appendonly, appendfsync, place[0])):
            config_refused.append(node.name)  # denied (ACL, renamed away, a managed service): said once below
        # What CONFIG says now only warns; the declaration alone decides the vote.
        said = [config["appendonly"], config["appendfsync"]]
        if node.fsync_always and None not in said and said != ["yes", "always"]:
            values = {"node": node.name, "appendonly": said[0], "appendfsync": said[1]}
            errors.append(Warning(Messages.NOT_FSYNCING.format(**values), hint=Hints.NOT_FSYNCING, id=Codes.NOT_FSYNCING))
        if isinstance(info, Exception):
            # INFO refused (ACL -info, renamed): the engine does not let such a node vote.
            if not node.fsync_always:
                values = {"node": node.name, "error": describe_error(info)}
                errors.append(Error(Messages.INFO_DENIED.format(**values), hint=Hints.INFO_DENIED, id=Codes.INFO_DENIED))
        elif isinstance(repl, Exception):
            # INFO server only (ACL -info +info|server): failovers are counted on every new run id.
            values = {"node": node.name, "error": describe_error(repl)}
            errors.append(Warning(Messages.NO_REPLICATION.format(**values), hint=Hints.NO_REPLICATION, id=Codes.NO_REPLICATION))
        run_id = parse_info(info).get("run_id") if not isinstance(info, Exception) else None
        if run_id:
            run_ids.setdefault(run_id, []).append(node.name)
        if isinstance(role, list) and role and role[0] not in (b"master", "master"):
            shown = _word(role[0])
            errors.append(Warning(Messages.REPLICA.format(node=node.name, role=shown), hint=Hints.REPLICA, id=Codes.REPLICA))
        value = config["maxmemory-policy"]
        if value is not None and value != "noeviction":  # volatile-* policies evict keys with a ttl: lock keys
            errors.append(Warning(Messages.EVICTION.format(node=node.name, policy=value), hint=Hints.EVICTION, id=Codes.EVICTION))
    same: set[str] = set()
    for names in run_ids.values():
        if len(names) > 1:
            same.update(names)
            errors.append(
                Warning(Messages.SAME_RUN_ID.format(nodes=", ".join(names)), hint=Hints.SAME_RUN_ID, id=Codes.SAME_RUN_ID)
            )
    hosts: dict[str, list[str]] = {}
    for node in nodes:
        if node.host is None and not node.path:
            continue  # a Sentinel node whose master is not known
        hosts.setdefault(_host(node), []).append(node.name)
    for host, names in hosts.items():
        if len(names) > 1:
            errors.append(
                Warning(Messages.SAME_HOST.format(nodes=", ".join(names), host=host), hint=Hints.SAME_HOST, id=Codes.SAME_HOST)
            )
    errors += _shared_dirs(nodes, configs, same)
    if config_refused:
        crowded = any(len(hosts.get(_host(node), ())) > 1 for node in nodes if node.name in config_refused)
        untold = ", and whether a node shares its data directory with another on its host" if crowded else ""
        values = {"nodes": ", ".join(config_refused), "untold": untold}
        errors.append(Info(Messages.CONFIG_REFUSED.format(**values), hint=Hints.CONFIG_REFUSED, id=Codes.CONFIG_REFUSED))
    return errors + _sentinel_warnings(nodes)


def _sentinel_warnings(nodes: list[Any]) -> list[Any]:
    """Sentinel nodes whose master takes writes with no replica in reach (it would go on granting
    locks through a partition while a replica is promoted)."""
    from django_redlock.core import LockManager, steps

    following = [node for node in nodes if node.sentinel is not None]
    if not following:
        return []
    manager = LockManager(following)
    try:
        (replies,) = manager._run(steps.ask(len(following), [("CONFIG", "GET", "min-replicas-to-write")], PROBE_TIMEOUT))
    finally:
        manager.close()
    errors: list[Any] = []
    for node, reply in zip(following, replies):
        value = _config_word(reply)
        if value == "0":
            errors.append(
                Warning(Messages.SENTINEL_WRITES.format(node=node.name, value=value), hint=Hints.SENTINEL_WRITES,
                        id=Codes.SENTINEL_WRITES)
            )
    return errors
