"""System checks for the lock topology.

The default checks read settings, and ask each node once, as a lock would,
whether it votes (nodes that sit out after a restart). The ones that ask
more (nodes that do not answer, replicas, one server under two addresses,
eviction policy) run with ``manage.py check --deploy`` (just those:
``--deploy --tag redlock_nodes``); ``manage.py redlock status`` shows the rest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.core.checks import Error, Warning, register
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
    SENTINEL_WRITES = "django_redlock.W013"
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
        locked_handler(None)
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


def _hooks_errors() -> list[Any]:
    """REDLOCK['HOOKS'] resolved as the managers resolve it: each entry imports and is a Hooks."""
    from django_redlock.manager import configured_hooks

    try:
        configured_hooks()
    except ImproperlyConfigured as exc:
        text = str(exc)
    except Exception as exc:  # noqa: BLE001 - a module that raised while importing: report it, do not crash check
        text = f"REDLOCK['HOOKS'] cannot be imported: {type(exc).__name__}: {exc}"
    else:
        return []
    return [Error(text, hint="Fix REDLOCK['HOOKS'].", id=Codes.OPTIONS)]


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
    if not problems:
        config = conf.get_config()
        errors += _max_ttl_errors(config) + _locked_response_errors(config["LOCKED_RESPONSE"]) + _hooks_errors()
    nodes, node_errors = _node_errors()
    errors += node_errors
    if node_errors or problems:
        return errors
    servers = Counter(_servers(nodes))
    distinct = len(servers)
    if distinct < 3:
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
    """Ask every node once, as a lock would, whether it votes: report nodes that sit out after a
    (re)start (delayed-restart rule), with the seconds left, and whether locks work meanwhile.

    Nodes that do not answer are left to ``check --deploy``.
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
    sitting = [s for s in statuses if s.reachable and ledger.DELAYED_RESTART in (s.not_voting_reason or "")]
    if not sitting:
        return []
    voting = sum(1 for s in statuses if s.votes)
    values: dict[str, Any] = {
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
    return [Warning(message, hint=ledger.RESTART_ADVICE, id=Codes.SITS_OUT)]


def _config_word(reply: Any) -> str | None:
    """The value of a ``CONFIG GET name`` reply, None when it was refused or did not come."""
    if isinstance(reply, list) and len(reply) == 2:
        return _word(reply[1])
    return None


def _word(value: Any) -> str:
    """A word a node replied, as a message may show it (control characters escaped)."""
    from django_redlock.core.records import printable

    return printable(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))


@register(TAG, NODES_TAG, deploy=True)
def check_nodes(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """With ``check --deploy`` (only these: ``--deploy --tag redlock_nodes``): ask every node.

    Reports nodes that do not answer, nodes that refuse INFO (they cannot
    vote) or only INFO replication (failovers cannot be told from restarts),
    replicas, one server listed under two addresses (same run id), several
    nodes on one host, eviction policies that could drop lock keys, and
    nodes declared ``FSYNC_ALWAYS`` whose CONFIG says otherwise.
    """
    from django_redlock.core import LockManager, steps
    from django_redlock.core.nodes import Failure, parse_info

    nodes, bad = _node_errors()
    if bad:
        return []  # reported by check_settings
    errors: list[Any] = []
    manager = LockManager(nodes)
    questions = [
        ("INFO", "server"),
        ("INFO", "replication"),
        ("ROLE",),
        ("CONFIG", "GET", "maxmemory-policy"),
        ("CONFIG", "GET", "appendonly"),
        ("CONFIG", "GET", "appendfsync"),
    ]
    infos, replication, roles, policies, aof, fsync = manager._run(steps.ask(len(nodes), questions, PROBE_TIMEOUT))
    answered = sum(1 for info in infos if not (isinstance(info, Failure) and not info.answered))
    if answered < manager.quorum:
        counts = {"answered": answered, "total": len(nodes), "quorum": manager.quorum}
        errors.append(Error(Messages.NO_QUORUM.format(**counts), hint=Hints.NO_QUORUM, id=Codes.NO_QUORUM))
    run_ids: dict[str, list[str]] = {}
    for node, appendonly, appendfsync in zip(nodes, aof, fsync):
        # What CONFIG says now only warns; the declaration alone decides the vote.
        said = [_config_word(appendonly), _config_word(appendfsync)]
        if node.fsync_always and None not in said and said != ["yes", "always"]:
            values = {"node": node.name, "appendonly": said[0], "appendfsync": said[1]}
            errors.append(Warning(Messages.NOT_FSYNCING.format(**values), hint=Hints.NOT_FSYNCING, id=Codes.NOT_FSYNCING))
    for node, info, role, policy, repl in zip(nodes, infos, roles, policies, replication):
        if isinstance(info, Failure) and info.answered:
            # INFO refused (ACL -info, renamed): the engine does not let such a node vote.
            if not node.fsync_always:
                errors.append(
                    Error(Messages.INFO_DENIED.format(node=node.name, error=info), hint=Hints.INFO_DENIED, id=Codes.INFO_DENIED)
                )
            info = None
        elif isinstance(repl, Failure) and repl.answered:
            # INFO server only (ACL -info +info|server): failovers are counted on every new run id.
            values = {"node": node.name, "error": repl}
            errors.append(Warning(Messages.NO_REPLICATION.format(**values), hint=Hints.NO_REPLICATION, id=Codes.NO_REPLICATION))
        elif isinstance(info, Failure):
            errors.append(
                Warning(Messages.UNREACHABLE.format(node=node.name, error=info), hint=Hints.UNREACHABLE, id=Codes.UNREACHABLE)
            )
            continue
        run_id = parse_info(info).get("run_id") if info is not None else None
        if run_id:
            run_ids.setdefault(run_id, []).append(node.name)
        if isinstance(role, list) and role and role[0] not in (b"master", "master"):
            shown = _word(role[0])
            errors.append(Warning(Messages.REPLICA.format(node=node.name, role=shown), hint=Hints.REPLICA, id=Codes.REPLICA))
        if isinstance(policy, list) and len(policy) == 2:
            value = _word(policy[1])
            if value != "noeviction":  # volatile-* policies evict keys with a ttl: lock keys
                errors.append(
                    Warning(Messages.EVICTION.format(node=node.name, policy=value), hint=Hints.EVICTION, id=Codes.EVICTION)
                )
    for names in run_ids.values():
        if len(names) > 1:
            errors.append(
                Warning(Messages.SAME_RUN_ID.format(nodes=", ".join(names)), hint=Hints.SAME_RUN_ID, id=Codes.SAME_RUN_ID)
            )
    hosts: dict[str, list[str]] = {}
    for node in nodes:
        if node.host is None and not node.path:
            continue  # a Sentinel node whose master is not known
        host = "localhost" if node.path or str(node.host) in LOOPBACK else str(node.host)
        hosts.setdefault(host, []).append(node.name)
    for host, names in hosts.items():
        if len(names) > 1:
            errors.append(
                Warning(Messages.SAME_HOST.format(nodes=", ".join(names), host=host), hint=Hints.SAME_HOST, id=Codes.SAME_HOST)
            )
    manager.close()
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
