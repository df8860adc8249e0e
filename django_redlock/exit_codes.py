"""The exit codes of the package's management commands: ``redlock`` and every ``@redlock_command``.

One table for all of them (see the docs' "Exit codes" section). A signal N that stops a
``@redlock_command`` exits 128 + N, after the lock is released.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    """How a command of the package ended. An ``int``: compare it with ``$?`` or ``returncode``."""

    #: Done: the command ran, every node answered (and votes), the lock was released.
    OK = 0
    #: Any other error: bad configuration, an invalid option value, the command's own failure.
    ERROR = 1
    #: Bad arguments on the command line (argparse's usage error). Never used for anything else.
    USAGE = 2
    #: The lock was lost while the command ran; the command was stopped.
    LOST = 3
    #: Fewer than a quorum of nodes answered (or can vote): nobody can hold a lock, or the answer is unknown.
    NO_QUORUM = 4
    #: Someone else holds the lock (``--lock-fail``, or ``--lock-wait`` ran out).
    LOCKED = 5
    #: A quorum answered, but not every node: the job was done, with less margin than configured.
    DEGRADED = 6
    #: ``redlock release``: no node that answered held a lock on the resource.
    NOT_HELD = 7
