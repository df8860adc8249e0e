"""Signals sent by django-redlock's default managers. Every signal's sender is the manager.

Receivers run in the thread that acquired, released or lost the lock (a lost
lock under auto-extension is reported from the extension thread), so keep them
quick and never let them raise.
"""

from django.dispatch import Signal

# kwargs: lock (the Lock or AsyncLock)
lock_acquired = Signal()

# kwargs: lock
lock_released = Signal()

# kwargs: lock
lock_extended = Signal()

# kwargs: lock, reason (str: why it is known to be lost)
lock_lost = Signal()

# kwargs: resource (str), error (LockNotAcquired or QuorumUnavailable)
lock_not_acquired = Signal()
