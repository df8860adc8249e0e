"""The nodes as operators see them: the steps behind ``node_status()`` and ``ping()``, and how a
node's replies to the restart probe are judged (:func:`status_of`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_redlock.core import clock, ledger
from django_redlock.core.base import ManagerConfig, NodeSeen
from django_redlock.core.records import NodeStatus
from django_redlock.core.books import Failure
from django_redlock.core.rounds import NOT_AWAITED, QUEUED, SKIPPED, describe_error
from django_redlock.core.steps import Fan, Step

if TYPE_CHECKING:
    from django_redlock.core.nodes import Node

__all__ = ["node_status", "ping", "seen_of", "status_of"]


def node_status(config: ManagerConfig, nodes: Sequence[Node], timeout: float) -> Step:
    """Send every node the restart probe and judge its vote as the engine would (see :func:`status_of`)."""
    timings: list[float | None] = [None] * len(nodes)
    results = yield Fan([ledger.PROBE] * len(nodes), timeout=timeout, timings=timings)
    read = config.clock()
    return [status_of(*row, config.restart_window, read) for row in zip(nodes, results, timings)]


def ping(nodes: Sequence[Node], timeout: float | None) -> Step:
    """Each node's round-trip time in seconds, or None for a node that did not answer (``timeout``
    None: the node timeout)."""
    timings: list[float | None] = [None] * len(nodes)
    yield Fan([("PING",)] * len(nodes), timeout=timeout, timings=timings)
    return {node.name: timing for node, timing in zip(nodes, timings)}


def status_of(node: Node, replies: Any, latency: float | None, window: float, read: float) -> NodeStatus:
    """Describe a node from its replies to the probe (:data:`~django_redlock.core.ledger.PROBE`:
    INFO server, INFO replication, CONFIG GET appendonly and appendfsync; read by ``read``), judged
    as a vote would be. What they show is learned as a probe's is: a failover is noticed here too."""
    declared = node.fsync_always
    common: dict[str, Any] = {"host": node.host, "port": node.port, "path": node.path, "fsync_declared": declared}
    if not isinstance(replies, list):
        error = str(replies) if replies else "no reply"
        return NodeStatus(node.name, False, error=error, votes=False, not_voting_reason=error, **common)
    server, replication, appendonly, appendfsync = replies
    restart = ledger.learn(replies, read)
    if restart is not None:
        node.history.learned(restart)
    info = ledger.probe_info(replies)
    persistence: dict[str, bool | str] = {}
    if ledger.config_value(appendonly):
        persistence["aof_enabled"] = ledger.config_value(appendonly) == "yes"
    if ledger.config_value(appendfsync):
        persistence["appendfsync"] = ledger.config_value(appendfsync)
    uptime = float(info["uptime_in_seconds"]) if "uptime_in_seconds" in info else None
    # Only the declaration waives the restart window: what CONFIG says now (shown in ``persistence``)
    # tells nothing of what the node kept across its last restart.
    age = ledger.sure_uptime(uptime) if uptime is not None else None
    sits_out = max(0.0, window - age) if age is not None and not declared and window > 0 else 0.0
    moved_at = node.history.moved_at  # a failover this process noticed (ledger.History)
    since = clock.now() - moved_at if moved_at is not None else math.inf
    refused = describe_error(server) if isinstance(server, Exception) else None
    passing = next((r for r in (server, replication) if isinstance(r, Exception) and not ledger.denied(r)), None)
    role = info.get("role")  # None when INFO replication is refused
    warning = ledger.NO_REPLICATION if refused is None and ledger.denied(replication) else None
    why: str | None = None  # why the node does not vote (None: it votes)
    if role is not None and role != "master":
        why = f"role {role}, not a master"
    elif window > 0 and since < window:
        sits_out = max(sits_out, window - since)
        why = ledger.failed_over(since, window - since)
    elif passing is not None and window > 0:
        why = f"INFO failed ({describe_error(passing)}): restart state unknown for now"
    elif declared:
        pass
    elif refused is not None:
        why = f"INFO refused ({refused}): restart state unknown; grant +info and +config|get, or declare FSYNC_ALWAYS"
    elif uptime is None:
        why = "INFO does not tell its uptime: its restart state cannot be known"
    elif sits_out:
        why = ledger.sits_out(age or 0.0, sits_out)
    return NodeStatus(
        node.name,
        True,
        latency=latency,
        role=role,
        run_id=info.get("run_id"),
        version=info.get("valkey_version") or info.get("redis_version"),
        server=("valkey" if "valkey_version" in info else "redis") if "redis_version" in info else None,
        uptime=uptime,
        error=refused,
        persistence=persistence,
        sits_out_for=sits_out,
        votes=why is None,
        not_voting_reason=why,
        warning=warning,
        **common,
    )


_NO_NEWS = frozenset((SKIPPED, QUEUED, NOT_AWAITED))
_NOT_VOTING = frozenset((ledger.UNKNOWN, ledger.DENIED))


def seen_of(
    names: Sequence[str], results: Sequence[Any], timings: Sequence[float | None] | None, window: float, rule: bool
) -> list[NodeSeen]:
    """What a round's ``results`` show of each node (see :class:`~django_redlock.core.config.NodeSeen`):
    ``window`` is the round's restart window (its replies were votes when > 0), ``rule`` whether the
    manager applies the delayed-restart rule at all."""
    counted = False if window > 0 or not rule else None
    seen = []
    for i, (name, result) in enumerate(zip(names, results)):
        seconds = timings[i] if timings is not None else None
        if not isinstance(result, Failure):
            seen.append(NodeSeen(name, True, counted, seconds))
            continue
        reason = result.reason
        if reason in _NO_NEWS:
            continue
        if ledger.DELAYED_RESTART in reason:
            seen.append(NodeSeen(name, True, True, seconds))
        elif result.answered or reason in _NOT_VOTING:  # an error reply; a vote whose restart state is unknown
            seen.append(NodeSeen(name, True, None, seconds))
        else:
            seen.append(NodeSeen(name, False, None, None))
    return seen
