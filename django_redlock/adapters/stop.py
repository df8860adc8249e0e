"""The stop guard of a locked command: SIGTERM/SIGINT, and the lock's loss, stop its main thread
outside its own lock calls."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django_redlock.core import steps

__all__ = ["REDELIVERY", "STOP_SIGNAL", "Guard", "Stop"]

#: The signal that stops a command whose lock was lost, sent to the main thread alone. SIGINT:
#: the guard handles it anyway while the command runs, so no other handler is displaced, and
#: libraries take it as "stop now" (psycopg 3 cancels the query it is waiting for).
STOP_SIGNAL = signal.SIGINT
#: How often a stop deferred until the main thread leaves an engine call is sent again (seconds).
REDELIVERY = 0.005


class Stop(KeyboardInterrupt):
    """Raised in the main thread to stop the command (a signal, or the lock was lost).

    A ``KeyboardInterrupt``, so that code which cleans up after Ctrl-C does so here too.
    """


class Guard:
    """SIGTERM/SIGINT handlers that only stop the main thread; the wrapper then releases the lock.

    The handler never touches the nodes: it may run while the main thread holds
    a node's mutex, and releasing from there would deadlock.
    """

    #: Installed guards, outermost first: a command may run another.
    active: list[Guard] = []

    def __init__(self, lost: threading.Event, in_main: bool) -> None:
        self.lost = lost
        self.main = threading.main_thread().ident if in_main else None
        self.armed = False  # True while handle() runs: a signal raises Stop there
        self.sent = False  # the stop signal was sent: the lock was lost
        self.mutex = threading.Lock()  # no stop signal is sent once disarmed
        self.signum: int | None = None  # the first signal received from outside
        self.previous: dict[int, Any] = {}
        self.deferred = threading.Event()  # a signal arrived inside an engine call

    def handler(self, signum: int, frame: Any) -> None:
        ours = signum == STOP_SIGNAL and any(guard.sent for guard in Guard.active)  # a lost lock's stop
        if self.signum is None and not ours:
            self.signum = signum
        if self.armed:
            if steps.engine_calls.depth:
                # Inside a lock call of the command's own (an item's acquire or release): unwinding
                # it half done would leave that lock on the nodes. Stop once it has returned: the
                # signal goes again the moment the call ends (and every few ms, as a fallback).
                steps.engine_calls.on_leave = self.resend
                self.deferred.set()
                return
            raise Stop()

    def resend(self) -> None:
        """Send the stop again to the main thread (it left the engine call that deferred it)."""
        if self.armed and self.main is not None:
            signal.pthread_kill(self.main, STOP_SIGNAL)

    def redeliver(self) -> None:
        """Send the stop again, every few milliseconds, while the handler defers it."""
        while self.deferred.wait():
            with self.mutex:
                if not self.armed:
                    return
                self.deferred.clear()
                signal.pthread_kill(self.main, STOP_SIGNAL)  # type: ignore[arg-type]
            time.sleep(REDELIVERY)

    def interrupt(self) -> None:
        """Stop the main thread from another thread (the watchdog saw the lock lost).

        A real signal: its handler raises in the main thread, which also ends a
        sleep, a socket read or a lock wait there. ``_thread.interrupt_main()``
        only flags the main thread, which then runs on until its blocking call returns.
        """
        with self.mutex:
            if not (self.armed and self.main is not None):
                return
            self.sent = True
            if hasattr(signal, "pthread_kill"):
                signal.pthread_kill(self.main, STOP_SIGNAL)
            else:  # pragma: no cover - Windows: flags the main thread only
                import _thread

                _thread.interrupt_main(STOP_SIGNAL)

    def disarm(self) -> None:
        with self.mutex:
            self.armed = False
        self.deferred.set()  # ends redeliver()

    def install(self) -> None:
        """Take SIGTERM and SIGINT over and arm: from here on a signal stops the main thread.

        Called before the command's lock is acquired (with :meth:`restore` in a ``finally``), so that
        no signal finds the lock granted and the default action still in place: that would end the
        process there and leave the lock on the nodes for its ttl. A signal that arrives while the
        handlers are being installed is recorded, and raised here once they are.
        """
        if self.main is None:
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[signum] = signal.signal(signum, self.handler)
            except (ValueError, OSError):  # pragma: no cover
                pass
        Guard.active.append(self)
        self.armed = True
        if hasattr(signal, "pthread_kill"):
            threading.Thread(target=self.redeliver, name="redlock-command-stop", daemon=True).start()
        self.check()

    def check(self) -> None:
        """Raise :class:`Stop` if a signal from outside was received while it could not be raised
        (during :meth:`install`, or deferred by a lock call that has returned since)."""
        if self.armed and self.signum is not None:
            raise Stop()

    def restore(self) -> None:
        """Put the previous handlers back. A signal received meanwhile goes on to a handler of the
        host's (a graceful shutdown); Python's own handlers are answered by the exit code."""
        if self in Guard.active:
            Guard.active.remove(self)
        for signum, old in self.previous.items():
            try:
                signal.signal(signum, old)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
        hosts = self.previous.get(self.signum) if self.signum is not None else None
        self.previous.clear()
        if self.signum is not None and callable(hosts) and hosts is not signal.default_int_handler:
            signal.raise_signal(self.signum)
