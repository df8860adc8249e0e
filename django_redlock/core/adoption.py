"""A hand-off: the handle of a lock acquired elsewhere, rebuilt from its resources and its token
(the read behind ``adopt()``; see :func:`~django_redlock.core.steps.adopt`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_redlock.core.base import failures_of, lost_error
from django_redlock.core.config import ManagerConfig, check_resources, name_of
from django_redlock.core.records import Holder
from django_redlock.core.books import Failure
from django_redlock.exceptions import QuorumUnavailable

__all__ = ["Adoption"]


class Adoption:
    """A hand-off: rebuild a held lock from its resources and its holder's token.

    One INSPECT of the lock keys on every node tells, per node, whether every
    key stores a value with that token, and how long the node keeps it. The
    handle is valid until the quorum-th longest of those ttls runs out,
    counted from before the read (minus drift): at least a quorum keeps the
    value until then.
    """

    def __init__(self, config: ManagerConfig, resource: Any, token: Any) -> None:
        self.resources = check_resources(resource)
        self.resource = name_of(self.resources)
        if not isinstance(token, str) or not token:
            raise ValueError(f"token must be the holder's token, a non-empty string (lock.token); got {token!r}.")
        self.token = token
        self.keys = tuple(config.key(r) for r in self.resources)
        self.config = config
        self.value: str | None = None
        self.holder: Holder | None = None
        #: How many resources the token's lock holds, when that is not what was asked for.
        self.whole_set: int | None = None

    def command(self) -> tuple[Any, ...]:
        return self.config.inspect_command(self.keys)

    def kept(self, reply: Any) -> float | None:
        """Seconds this node keeps the token's value on every key; None when it does not store it."""
        if not isinstance(reply, list):
            return None
        values, ttls = reply[0 : 2 * len(self.keys) : 2], reply[1 : 2 * len(self.keys) : 2]
        first = values[0]
        if not first or any(v != first for v in values) or any(not isinstance(t, int) or t <= 0 for t in ttls):
            return None
        holder = self.holder if self.value is not None and first == self.value.encode() else Holder.decode(first)
        if holder is None or holder.token != self.token:
            return None
        if holder.members != len(self.keys):
            self.whole_set = holder.members
            return None
        if self.value is None:
            self.holder, self.value = holder, first.decode("utf-8", "replace") if isinstance(first, bytes) else first
        return min(int(t) for t in ttls) / 1000.0

    def judge(self, nodes: Sequence[Any], replies: Sequence[Any], quorum: int) -> float:
        """Seconds the lock stays held, counted from before the read; raises when a quorum does not hold it."""
        kept = sorted((k for k in map(self.kept, replies) if k is not None), reverse=True)
        if self.whole_set is not None:
            raise ValueError(
                f"The lock with this token holds {self.whole_set} resource(s), not the {len(self.keys)} named "
                f"({self.resource!r}): adopt exactly the resources it was acquired on (lock.resources)."
            )
        if len(kept) >= quorum:
            return kept[quorum - 1] - self.config.drift(kept[quorum - 1])
        total = len(nodes)
        failures = failures_of(nodes, replies, "does not store this token's value", lambda r: self.kept(r) is not None)
        detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
        unreachable = sum(1 for r in replies if isinstance(r, Failure))
        if total - unreachable - len(kept) <= total - quorum:  # the silent nodes may still hold it
            raise QuorumUnavailable(
                f"Cannot take over lock {self.resource!r}: {len(kept)} of {total} nodes store its token, "
                f"{quorum} needed, and too few answered to tell ({detail}).",
                resource=self.resource,
                granted=len(kept),
                quorum=quorum,
                total=total,
                failures=failures,
            )
        raise lost_error(
            self.resource,
            f"only {len(kept)} of {total} nodes store the token's value, {quorum} needed "
            f"(released, expired or taken over; {detail})",
        )
