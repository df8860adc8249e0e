"""Mutexes that a forked child gets fresh, and a cached property that needs none.

A child starts with one thread but with every mutex as the parent's threads left it: one that
another thread held at the fork stays held in the child, and the child's first use of it hangs.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

__all__ = ["cached", "mutex"]

_T = TypeVar("_T")

#: Objects whose mutexes are replaced in a forked child, and the attribute names of those mutexes.
_OWNERS: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


def mutex(owner: object, name: str) -> threading.Lock:
    """A new mutex for ``owner.<name>``; a forked child gets a new one there too."""
    _OWNERS.setdefault(owner, set()).add(name)
    return threading.Lock()


def _renew_in_child() -> None:
    for owner, names in list(_OWNERS.items()):
        for name in names:
            setattr(owner, name, threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)


class cached(Generic[_T]):
    """A property computed once per instance, with no lock (before Python 3.12,
    :func:`functools.cached_property` holds one lock per class while it computes)."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    @overload
    def __get__(self, instance: None, owner: type) -> cached[_T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> _T: ...

    def __get__(self, instance: object, owner: type) -> _T | cached[_T]:
        if instance is None:
            return self
        value: _T = self.func(instance)
        instance.__dict__[self.name] = value  # found before this descriptor from now on
        return value
