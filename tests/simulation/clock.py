"""Per-process monotonic clocks that drift against true time.

True time (``world.now``, seconds) belongs to the scheduler and no simulated
process can read it. Each process reads its own :class:`Clock`:
``local = offset + rate * true``. ``rate`` stays within a drift bound, so two
processes' clocks disagree about a duration by at most that bound; the offset
makes readings of different processes incomparable, as real monotonic clocks are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .world import World

__all__ = ["Clock", "drifting_clock", "SAFE_SHARE"]

#: Share of the algorithm's drift bound the clocks use by default: the
#: assumption holds with a margin, so a violation means a bug, not bad luck.
SAFE_SHARE = 0.9


class Clock:
    """A monotonic clock: ``offset + rate * world.now``."""

    __slots__ = ("world", "rate", "offset")

    def __init__(self, world: Any, rate: float = 1.0, offset: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("a clock rate must be positive")
        self.world = world
        self.rate = rate
        self.offset = offset

    def now(self) -> float:
        """The local reading, in local seconds."""
        return self.offset + self.rate * self.world.now

    def to_true(self, local_t: float) -> float:
        """The true time at which this clock reads ``local_t``."""
        return (local_t - self.offset) / self.rate

    def true_duration(self, local_dt: float) -> float:
        """How long, in true seconds, ``local_dt`` seconds on this clock last."""
        return local_dt / self.rate

    def local_duration(self, true_dt: float) -> float:
        """How many local seconds pass on this clock in ``true_dt`` true seconds."""
        return true_dt * self.rate

    def __repr__(self) -> str:
        return f"<Clock rate={self.rate:.6f} offset={self.offset:.3f}>"


def drifting_clock(world: World, drift: float, label: str, *, share: float = SAFE_SHARE) -> Clock:
    """A clock whose rate is chosen within ``1 ± share * drift / 2``.

    ``drift`` is the algorithm's bound on how far two clocks may disagree about a
    duration (the engine's ``clock_drift_factor``). Each clock gets half of the
    allowed share, so any *pair* of clocks stays within ``share * drift`` of each
    other. With ``share <= 1`` the algorithm's assumption holds; a ``share`` above 1
    (say 20) breaks it on purpose, and a correct client may then be caught.
    The ends of the range are chosen often: that is where drift bugs show.
    """
    half = share * drift / 2.0
    lo, hi = 1.0 - half, 1.0 + half
    if half <= 0:
        rate = 1.0
    else:
        where = world.choose(("low", "high", "inside"), f"clock rate {label}")
        rate = lo if where == "low" else hi if where == "high" else world.uniform(lo, hi, f"clock rate {label}")
    offset = world.rng.uniform(0.0, 10_000.0)  # an arbitrary boot time: readings are not comparable
    return Clock(world, rate, offset)
