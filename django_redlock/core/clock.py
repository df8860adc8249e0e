"""The clock the engine measures validity, deadlines and node ages on.

``time.monotonic()`` stops while a Linux host or virtual machine is suspended, so a lock taken
before a suspend would keep its whole validity after it, although the nodes' clocks (other
machines) ran on and expired its keys. Linux's boot-time clock is monotonic and counts the
suspended time; elsewhere the engine reads ``time.monotonic()``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

__all__ = ["BOOTTIME", "now"]


def _boottime() -> Callable[[], float] | None:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime(clock_id)
    except OSError:  # a kernel or sandbox that does not offer it
        return None
    return functools.partial(time.clock_gettime, clock_id)


_read = _boottime()

#: True when :func:`now` counts the time the host spends suspended (Linux's ``CLOCK_BOOTTIME``).
BOOTTIME = _read is not None

#: Seconds on the engine's clock (no meaning of its own: only differences count).
now: Callable[[], float] = _read or time.monotonic
