"""``manage.py redlock list|release|status``: see and clear live locks, check the nodes."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import operator
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redlock.adapters.commands import keep_exit_code
from django_redlock.adapters.options import node_wait, option_type, option_value
from django_redlock.core import ledger
from django_redlock.core.records import DIGEST_DIGITS, STATE_WORDS, printable, same_everywhere, seconds
from django_redlock.exceptions import LockError, QuorumUnavailable
from django_redlock.exit_codes import ExitCode

#: Django's own options, taken after the subcommand too (``redlock status --settings=...``).
GLOBAL_OPTIONS = ("verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks")


class Command(BaseCommand):
    help = "Inspect Redlock: list live locks, force-release one, or show each node's status."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", metavar="{list,release,status}")
        sub.required = True
        listing = sub.add_parser("list", help="Live lock keys on every node, with holder, ttl and calls waiting.")
        listing.add_argument("--match", default=None, help="Only resources containing this text.")
        listing.add_argument("--json", action="store_true", help="Machine-readable output.")
        release = sub.add_parser("release", help="Delete a resource's lock key on every node, whoever holds it.")
        release.add_argument("resource")
        release.add_argument("--json", action="store_true", help="Machine-readable output.")
        status = sub.add_parser("status", help="Each node's reachability, role, latency and run id.")
        status.add_argument("--json", action="store_true", help="Machine-readable output.")
        status.add_argument("--timeout", type=option_type(node_wait), default=1.0, help="Seconds to wait for each node (default 1).")
        for subparser in (listing, release, status):
            accept_global_options(parser, subparser)

    def run_from_argv(self, argv: list[str]) -> None:
        keep_exit_code(super().run_from_argv, argv)

    def handle(self, *args: Any, **options: Any) -> None:
        from django_redlock.manager import get_lock_manager

        try:
            manager = get_lock_manager()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        action = options["action"]
        try:
            getattr(self, f"do_{action}")(manager, options)
        except QuorumUnavailable as exc:
            raise CommandError(str(exc), returncode=ExitCode.NO_QUORUM) from exc
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

    def do_list(self, manager: Any, options: dict[str, Any]) -> None:
        listing = manager.lock_listing(match=options["match"])
        records = listing.records
        if options["json"]:
            self.stdout.write(listing_json(records, manager.nodes))
        elif not records:
            self.stdout.write("No live locks." if listing.trustworthy else "No live locks on the nodes that answered.")
        else:
            self.stdout.write(self.listing_text(records))
        for name, why in listing.down.items():
            self.stderr.write(
                self.style.WARNING(f"Node {name} did not answer ({printable(why)}); its keys are not listed.")
            )
        if not listing.trustworthy:
            raise CommandError(
                f"Only {listing.answered} of {listing.total} nodes answered, {listing.quorum} needed: whether "
                "these locks are held is unknown, and a lock held on a quorum may be missing from this list.",
                returncode=ExitCode.NO_QUORUM,
            )
        if listing.down:
            raise CommandError(
                f"Degraded: {listing.answered} of {listing.total} nodes answered ({listing.quorum} needed); "
                "a lock held by the others alone is listed with fewer nodes, or as unknown.",
                returncode=ExitCode.DEGRADED,
            )

    def listing_text(self, records: Sequence[Any]) -> str:
        """One line a lock under a header, as one string: thousands of small writes cost more than the lines.
        Resources and holders were written by others: shown with their control characters escaped."""
        names = [printable(r.resource) for r in records]
        width = max(8, *map(len, names))
        words = max(len(w) for w in STATE_WORDS.values())
        states = {
            state: (self.style.SUCCESS if state == "held" else self.style.WARNING)(f"{word:<{words}}")
            for state, word in STATE_WORDS.items()
        }
        digits = DIGEST_DIGITS
        lines = [
            f"{'RESOURCE':<{width}}  {'STATE':<{words}}  {'NODES':>8}  {'TTL':>8}  {'WAITING':>7}  "
            f"{'DIGEST':<{digits}}  HOLDER"
        ]
        row = f"%-{width}s  %s  %8s  %7.1fs  %7d  %s  %s"  # one %-format a line: faster than an f-string's specs
        lines += [
            row % (name, states[r.state], nodes_text(r), r.ttl, r.waiting, r.holder.digest, r.holder)
            for name, r in zip(names, records)
        ]
        return "\n".join(lines)

    def do_release(self, manager: Any, options: dict[str, Any]) -> None:
        resource = options["resource"]
        done = manager.force_release_detail(resource)
        which = "that answered " if done.unreachable else ""
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {"resource": resource, "nodes": done.deleted, "total": done.total, "unreachable": done.unreachable}
                )
            )
        elif done.deleted:
            self.stdout.write(self.style.SUCCESS(f"Released {resource!r} on {done.deleted} of {done.total} nodes."))
        for name, why in done.unreachable.items():
            self.stderr.write(
                self.style.WARNING(
                    f"Node {name} could not release it ({printable(why)}); a key there expires with its ttl."
                )
            )
        if len(done.unreachable) >= manager.quorum:
            raise CommandError(
                f"{len(done.unreachable)} of {done.total} nodes did not answer: the lock may still be held on a "
                "quorum until its keys expire.",
                returncode=ExitCode.NO_QUORUM,
            )
        if not done.deleted:
            raise CommandError(
                f"Nothing to release: no node {which}held a lock on {resource!r}.", returncode=ExitCode.NOT_HELD
            )
        if done.unreachable:
            raise CommandError(
                f"Degraded: {len(done.unreachable)} of {done.total} nodes did not answer.", returncode=ExitCode.DEGRADED
            )

    def do_status(self, manager: Any, options: dict[str, Any]) -> None:
        statuses = manager.node_status(timeout=option_value(options, "timeout", "--timeout", node_wait))
        voting = [s for s in statuses if s.votes]
        quorum = manager.quorum
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {"quorum": quorum, "voting": len(voting), "nodes": [status_json(s) for s in statuses]}, indent=2
                )
            )
        else:
            for s in statuses:
                self.stdout.write(self.status_line(s))
                if s.warning:
                    self.stdout.write(self.style.WARNING(f"{'':<28} {printable(s.warning)}"))
            unread = [s.name for s in statuses if s.reachable and s.version is not None and not s.persistence]
            if unread:
                self.stdout.write(f"{', '.join(unread)}: {ledger.CONFIG_REFUSED}.")
            summary = f"{len(voting)} of {len(statuses)} nodes can vote; quorum is {quorum}."
            style = self.style.ERROR if len(voting) < quorum else self.style.WARNING
            self.stdout.write(self.style.SUCCESS(summary) if len(voting) == len(statuses) else style(summary))
        if len(voting) < quorum:
            raise CommandError(
                f"No quorum: {len(voting)} of {len(statuses)} nodes can vote, {quorum} needed.",
                returncode=ExitCode.NO_QUORUM,
            )
        if len(voting) < len(statuses):
            raise CommandError(
                f"Degraded: {len(voting)} of {len(statuses)} nodes can vote; locks work while {quorum} can.",
                returncode=ExitCode.DEGRADED,
            )

    def status_line(self, s: Any) -> str:
        """One node's line; what the node told (role, version, run id, reasons) shown escaped."""
        if not s.reachable:
            return f"{s.name:<28} {self.style.ERROR('DOWN')}  {printable(str(s.error))}"
        latency = f"{s.latency * 1000:6.2f} ms" if s.latency is not None else "     ? ms"
        says_fsync = s.persistence.get("appendfsync") == "always" and s.persistence.get("aof_enabled") is True
        unread = not s.persistence  # CONFIG refused (said once, below the nodes), or INFO refused
        if s.fsync_declared:
            persistence = "fsync always (declared)" if says_fsync or unread else "declared fsync always, runs without"
        elif unread:
            persistence = "persistence ?"
        elif says_fsync:
            persistence = "fsync always (not declared: sits out after a restart)"
        else:
            persistence = "no fsync per write"
        if s.version is None:  # INFO refused: nothing more to show
            line = f"{s.name:<28} {self.style.SUCCESS('up')}    {'?':<7} {latency}" + (
                f"  {persistence}" if s.fsync_declared else ""
            )
        else:
            role, version, run = (printable(str(v)) for v in (s.role or "?", s.version, (s.run_id or "?")[:12]))
            line = (
                f"{s.name:<28} {self.style.SUCCESS('up')}    {role:<7} {latency}  {s.server or 'redis'} {version}  "
                f"up {s.uptime or 0:.0f}s  {persistence}  run {run}"
            )
        if not s.votes:
            line += self.style.WARNING(f"  does not vote: {printable(str(s.not_voting_reason))}")
        return line


def accept_global_options(parser: CommandParser, subparser: argparse.ArgumentParser) -> None:
    """Let ``subparser`` take Django's global options as well (its own value wins over one given before it)."""
    for action in parser._actions:
        if action.dest not in GLOBAL_OPTIONS:
            continue
        # SUPPRESS: an option not given after the subcommand leaves the value given before it, or Django's default.
        how: dict[str, Any] = {"dest": action.dest, "default": argparse.SUPPRESS, "help": action.help}
        if action.nargs == 0:  # a flag
            subparser.add_argument(*action.option_strings, action="store_true", **how)
        else:
            if action.type is not None:
                how["type"] = action.type
            subparser.add_argument(*action.option_strings, choices=action.choices, metavar=action.metavar, **how)


def listing_json(records: Sequence[Any], nodes: Sequence[str]) -> str:
    """``redlock list --json``: a list with one lock a line, each an object with ``resource``, ``key``,
    ``state``, ``nodes_holding``, ``total``, ``ttl`` (seconds), ``waiting``, ``holder``, ``entries``
    (one per node holding the key: ``node``, ``ttl``, ``waiting``, ``holder``) and ``down``.

    Written piece by piece exactly as ``json.dumps`` writes it (ASCII, ", " and ": "): each holder
    is encoded once, not once per node, no dict is built per node, and ttls are written from their
    milliseconds (see :func:`seconds_json`). The usual lock (one holder on every node, nobody
    waiting) joins its entries around their one tail.
    """
    if not records:
        return "[]"
    starts = {name: f'{{"node": {_text(name)}, "ttl": ' for name in nodes}
    parts = []
    nodes_seen: tuple[str, ...] = ()
    heads: list[str] = []
    downs: dict[tuple[str, ...], str] = {}
    for r in records:
        holders = r.holders()
        main = holder_json(r.holder)
        if r.nodes is not nodes_seen:  # a listing's records share the tuple of all nodes
            nodes_seen, heads = r.nodes, [starts[node] for node in r.nodes]
        ttls = seconds_json(r.pttls)
        if same_everywhere(holders) and not any(r.lives):
            tail = f', "waiting": 0, "holder": {main}}}'
            entries = (tail + ", ").join(map(operator.add, heads, ttls)) + tail
        else:
            if same_everywhere(holders):  # one holder on every node (the same object)
                ends = [f', "holder": {main}}}'] * len(holders)
            else:
                encoded = {key: holder_json(h) for key, h in {id(h): h for h in holders}.items()}
                ends = [f', "holder": {encoded[id(h)]}}}' for h in holders]
            entries = ", ".join(
                [f'{head}{ttl}, "waiting": {live}{end}' for head, ttl, live, end in zip(heads, ttls, r.lives, ends)]
            )
        down = downs.get(r.down)
        if down is None:
            down = downs[r.down] = ", ".join(map(_text, r.down))
        parts += [
            f'{{"resource": {_text(r.resource)}, "key": {_text(r.key)}, "state": "{r.state}", '
            f'"nodes_holding": {r.nodes_holding}, "total": {r.total}, '
            f'"ttl": {_seconds_text(r.ttl)}, "waiting": {r.waiting}, '
            f'"holder": {main}, "entries": [',
            entries,
            f'], "down": [{down}]}},\n  ',
        ]
    parts[-1] = parts[-1][:-4] + "\n]"  # no comma after the last lock
    return "[\n  " + "".join(parts)


#: The fraction of a second of each count of milliseconds, as repr() writes it: ".0", ".001" ... ".999".
_FRACTIONS = [f".{ms:03d}".rstrip("0") if ms else ".0" for ms in range(1000)]
_THOUSAND = itertools.repeat(1000)


def seconds_json(pttls: Sequence[int]) -> list[str]:
    """``repr(seconds(pttl))`` of each ttl (ms), as json.dumps writes the seconds: from the integer,
    several times faster than repr() of a float. The whole seconds and the trimmed thousandths are
    the shortest text that reads back as ``pttl / 1000.0``, which is what repr() writes, up to
    10**15 ms; past that (and for -1, no expiry) repr() itself."""
    if pttls and min(pttls) >= 0 and max(pttls) < 10**15:
        return list(
            map(
                operator.add,
                map(str, map(operator.floordiv, pttls, _THOUSAND)),
                map(_FRACTIONS.__getitem__, map(operator.mod, pttls, _THOUSAND)),
            )
        )
    return [repr(seconds(pttl)) for pttl in pttls]


def _seconds_text(ttl: float) -> str:
    """``repr(ttl)`` of a lock's ttl in seconds, from its milliseconds (see :func:`seconds_json`)."""
    pttl = round(ttl * 1000) if 0 <= ttl < 1e12 else -1
    return seconds_json((pttl,))[0] if pttl >= 0 and pttl / 1000.0 == ttl else repr(ttl)


def nodes_text(record: Any) -> str:
    """How many nodes hold the lock's main holder, of all: ``"2 of 3"``."""
    return f"{record.nodes_holding} of {record.total}"


def holder_json(holder: Any) -> str:
    """A holder as JSON: ``null``, or an object with ``digest`` (never the token: it authorizes release),
    ``host``, ``pid``, ``label`` and ``acquired_at``."""
    if holder is None:
        return "null"
    host, label = holder.host, holder.label
    return (
        f'{{"digest": "{holder.digest}", "host": {_text(host) if type(host) is str else _scalar(host)}, '
        f'"pid": {_scalar(holder.pid)}, "label": {_text(label) if type(label) is str else _scalar(label)}, '
        f'"acquired_at": {_scalar(holder.acquired_at)}}}'
    )


_text = json.encoder.encode_basestring_ascii  # how json.dumps writes a string


def _scalar(value: Any) -> str:
    """A string, number or None as json.dumps writes it."""
    kind = type(value)
    if kind is str:
        return _text(value)
    if value is None:
        return "null"
    if kind is int or (kind is float and math.isfinite(value)):
        return repr(value)
    return "null" if kind is float else json.dumps(value)  # NaN and Infinity are not JSON


def status_json(status: Any) -> dict[str, Any]:
    return {
        "name": status.name,
        "reachable": status.reachable,
        "role": status.role,
        "latency_ms": round(status.latency * 1000, 3) if status.latency is not None else None,
        "run_id": status.run_id,
        "version": status.version,
        "server": status.server,
        "uptime": status.uptime,
        "persistence": status.persistence,
        "sits_out_for": status.sits_out_for,
        "votes": status.votes,
        "not_voting_reason": status.not_voting_reason,
        "fsync_declared": status.fsync_declared,
        "warning": status.warning,
        "error": status.error,
    }
