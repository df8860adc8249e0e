"""A signal that interrupts a round (KeyboardInterrupt, a soft time limit, a SIGALRM request timeout)
leaves every connection in step with its replies, on real servers.

An exception raised by a signal handler can land anywhere in a fan-out: after a command was booked
but before it was written, or after a reply was read but before it was booked. A connection left
there would pair every later reply with the command before it. The round gives up such
connections instead: what they carried is booked as possibly landed, as for a dropped connection.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time

import pytest
import redis

from django_redlock.core import LockManager, clock, steps
from django_redlock.core.books import Failure


class Interrupt(BaseException):
    """What a signal handler raises: not an Exception, as KeyboardInterrupt."""


# On redis-py 6.x, an interrupt inside its connect() can leave a later connect() raising
# UnboundLocalError from within redis-py, so the final round finds one node unavailable (about 3 runs
# in 8 on 6.4.0, with or without the engine changes since; 0 in 8 on 8.1 on the same Python).
@pytest.mark.xfail(
    int(redis.__version__.split(".")[0]) < 8,
    reason="redis-py 6.x: a connect() interrupted by a signal can break a later connect()",
    strict=False,
)
def test_a_round_interrupted_anywhere_leaves_no_connection_out_of_step(servers):
    rng = random.Random(7)
    manager = LockManager(servers.urls, ttl=10, retry_count=0, node_timeout=0.05, restart_window=0)

    armed = [False]  # only while a round runs: a signal still pending when it ended lands nowhere

    def interrupt(signum, frame):
        if armed[0]:
            raise Interrupt()

    def echo(tag: str) -> list[object]:
        """One round of ECHO to every node: the engine's fan-out, with no hook or log line around it
        (a signal landing in the logging module could leave its mutex held: not what is tested here)."""
        return manager._run(steps.ask(len(servers), [("ECHO", tag)], 0.05))[0]

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupted = wrong = 0
    try:
        echo("warm-up")
        deadline = time.monotonic() + 3.0
        i = 0
        while time.monotonic() < deadline:
            i += 1
            try:
                try:
                    armed[0] = True
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00001, 0.0015))
                    replies = echo(f"r{i}")
                finally:
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupt:
                interrupted += 1
                continue
            wrong += sum(1 for r in replies if not isinstance(r, Failure) and r != f"r{i}".encode())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted > 100, interrupted
    time.sleep(0.3)  # every reply that is coming has come (local servers, well under the stale limit)
    out_of_step = []
    for node in manager.node_list:
        node._drain_parked(clock.now())
        for conn in list(node.books.parked) + [conn for conn, _ in node.books.idle]:
            if conn.expect:
                out_of_step.append((node.name, [entry.kind.name for entry in conn.expect]))
    replies = echo("after")  # every node answers its own reply at once
    manager.close()
    assert out_of_step == [], f"connections waiting for replies that will never come: {out_of_step}"
    assert wrong == 0, f"{wrong} replies answered another command"
    # Nor is the thread's engine-call depth left off: a command's stop would be deferred forever.
    assert steps.engine_calls.depth == 0
    assert replies == [b"after"] * len(servers), replies


def test_a_signal_right_after_a_node_mutex_is_taken_leaves_no_mutex_held(servers):
    """A release round takes every node's mutex at once (it owes its release to all of them). A signal
    handler runs where the interpreter checks for signals, which includes right after a C call such
    as ``Lock.acquire()`` returns: raising there must not leave that node's mutex taken, which would
    hang the round's own background resend and every later round of the process on that node.
    Raised here from a profile function at the k-th C call's return in the fan-out, for each k, as a
    handler would be at that point. Run on a thread of its own: a hang fails the test."""
    from django_redlock.core import nodes

    manager = LockManager(servers.urls, ttl=10, retry_count=0, node_timeout=0.05, restart_window=0)
    seen: list[str] = []
    outcome: list[object] = []

    def interrupting_at(k: int):
        def at_c_return(frame, event, arg):
            if event == "c_return" and frame.f_code is nodes.fanout.__code__:
                seen.append(getattr(arg, "__qualname__", repr(arg)))
                if len(seen) == k:
                    raise Interrupt()

        return at_c_return

    def storm() -> None:
        for k in range(1, 100):  # until a release runs past its fan-out's last C call
            lock = manager.acquire("r", blocking=True, timeout=2)
            seen.clear()
            sys.setprofile(interrupting_at(k))
            try:
                lock.release()
            except Interrupt:
                pass
            else:
                outcome.append(k - 1)  # every C call of the fan-out was interrupted once
                return
            finally:
                sys.setprofile(None)
            held = [node.name for node in manager.node_list if node._mutex.locked()]
            if held:
                outcome.append(f"mutexes left taken by an interrupt after {seen[k - 1:k]}: {held}")
                return

    worker = threading.Thread(target=storm, daemon=True)
    try:
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), f"a release hung after an interrupt after {seen[-1:]} (a node mutex left taken)"
        assert outcome and isinstance(outcome[0], int) and outcome[0] >= 8, outcome
    finally:
        manager.close() if not worker.is_alive() else None
