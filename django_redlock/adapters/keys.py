"""Lock keys: format strings filled from a call's arguments, or callables; the view's request."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from django_redlock.core.config import check_resource, check_resources

__all__ = ["Key", "KeySpec", "Keys", "KeysSpec", "check_key", "find_request"]

#: A lock key: a format string, or a callable returning the resource (or a list of them).
KeySpec = str | Callable[..., Any]
#: What ``@redlock`` takes: one key, or a list of format strings to lock together (all or nothing).
KeysSpec = KeySpec | list[str] | tuple[str, ...]


class Key:
    """A lock key: a format string filled from the call's arguments, or a callable."""

    def __init__(self, spec: KeySpec, func: Callable[..., Any] | None) -> None:
        if not (isinstance(spec, str) and spec) and not callable(spec):
            raise ImproperlyConfigured(f"redlock key must be a non-empty format string or a callable; got {spec!r}.")
        self.spec = spec
        self.fields: list[str] = []
        self.signature: inspect.Signature | None = None
        if func is not None:
            try:
                self.signature = inspect.signature(func)
            except (TypeError, ValueError):
                self.signature = None
        if isinstance(spec, str):
            try:
                parsed = list(string.Formatter().parse(spec))
            except ValueError as exc:
                raise ImproperlyConfigured(f"redlock key {spec!r} is not a valid format string: {exc}.") from None
            for _, field, _, _ in parsed:
                if field is None:
                    continue
                root = field.split(".", 1)[0].split("[", 1)[0]
                if not root or root.isdigit():
                    raise ImproperlyConfigured(
                        f"redlock key {spec!r}: use named placeholders such as '{{pk}}', not {{{field}}}."
                    )
                self.fields.append(root)
            self._check_fields(func)

    def _check_fields(self, func: Callable[..., Any] | None) -> None:
        if self.signature is None:
            return
        params = self.signature.parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return  # URL kwargs arrive through **kwargs: checked per call
        missing = [f for f in self.fields if f not in params]
        if missing:
            name = getattr(func, "__qualname__", repr(func))
            raise ImproperlyConfigured(
                f"redlock key {self.spec!r} uses {', '.join(map(repr, missing))}, which {name}() does not take; "
                f"available: {', '.join(params) or 'nothing'}."
            )

    def values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if self.signature is not None:
            try:
                bound = self.signature.bind_partial(*args, **kwargs)
                bound.apply_defaults()
                values.update(bound.arguments)
                for param in self.signature.parameters.values():
                    if param.kind is param.VAR_KEYWORD:
                        values.update(values.pop(param.name, {}))
            except TypeError:
                values.update(kwargs)
        else:
            values.update(kwargs)
        request = find_request(args, kwargs)
        if request is not None:
            values.setdefault("request", request)
        return values

    def format(self, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
        values = self.values(args, kwargs)
        if extra:
            values.update(extra)
        if callable(self.spec):
            key = self.spec(*args, **kwargs)
        else:
            missing = [f for f in self.fields if f not in values]
            if missing:
                raise ImproperlyConfigured(
                    f"redlock key {self.spec!r}: no value for {', '.join(map(repr, missing))} in this call "
                    f"(have: {', '.join(sorted(values)) or 'nothing'}); refusing to lock the literal key."
                )
            try:
                key = self.spec.format(**values)
            except (AttributeError, KeyError, IndexError) as exc:
                raise ImproperlyConfigured(f"redlock key {self.spec!r} could not be filled: {exc!r}.") from None
        if callable(self.spec) and isinstance(key, (list, tuple)) and key and all(isinstance(k, str) and k for k in key):
            return list(key)  # type: ignore[return-value]  # a callable may name several resources
        if not isinstance(key, str) or not key:
            raise ImproperlyConfigured(f"redlock key {self.spec!r} produced {key!r}; expected a non-empty string.")
        return key


class Keys:
    """One :class:`Key`, or several locked together (a list or tuple of format strings)."""

    def __init__(self, spec: KeysSpec, func: Callable[..., Any] | None) -> None:
        if isinstance(spec, (list, tuple)):
            if not spec or not all(isinstance(s, str) for s in spec):
                raise ImproperlyConfigured(f"redlock keys must be a non-empty list of format strings; got {spec!r}.")
            self.keys = [Key(s, func) for s in spec]
            self.several = True
        else:
            self.keys = [Key(spec, func)]
            self.several = False

    def format(self, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
        """The resource to lock, or the list of resources; :class:`~django_redlock.exceptions.InvalidResource`
        when the call's values make one no lock may name (a view answers 400)."""
        if not self.several:
            return check_key(self.keys[0].format(args, kwargs, extra))
        return check_key([key.format(args, kwargs, extra) for key in self.keys])


def check_key(resources: Any) -> Any:
    """``resources`` (a key's string, or a list of them), once known to name a lock: raises
    :class:`~django_redlock.exceptions.InvalidResource` for a name too long, with a control character, or
    that UTF-8 cannot encode, or too many names (what the values of a request made); anything else is left
    to the hold to refuse."""
    if isinstance(resources, str) and resources:
        check_resource(resources)
    elif isinstance(resources, list) and resources and all(isinstance(r, str) and r for r in resources):
        check_resources(resources)
    return resources


def find_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> HttpRequest | None:
    """The view's request among the first arguments (a REST framework Request: the request it wraps)."""
    for value in (*args[:2], kwargs.get("request")):
        if isinstance(value, HttpRequest):
            return value
        wrapped = getattr(value, "_request", None)  # rest_framework.request.Request
        if isinstance(wrapped, HttpRequest):
            wrapped._redlock_api = True  # type: ignore[attr-defined]  # answered in JSON
            return wrapped
    return None

