"""Fencing on the storage side, with the Django ORM.

A lock alone cannot stop a holder that was paused (GC, swap, a stopped VM)
past its validity from writing. The fencing token can: the storage keeps the
highest token it has accepted and refuses writes that carry a lower one. This
module does that in one SQL ``UPDATE ... WHERE token < %s``, so the check and
the write are atomic in the database::

    class Invoice(models.Model):
        fencing_token = FencingTokenField()
        objects = FencedQuerySet.as_manager()

    with manager.lock(f"invoice-{pk}") as lock:
        Invoice.objects.filter(pk=pk).fenced_update(lock.fencing_token, status="paid")

``fenced_update`` raises :class:`StaleToken` when a newer holder already wrote.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from django_redlock.exceptions import StaleToken

__all__ = ["FencedQuerySet", "FencingTokenField", "StaleToken", "fenced_update"]


class FencingTokenField(models.BigIntegerField):
    """The highest fencing token a row has accepted (64-bit: tokens start at the clock in microseconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple[Any, ...]:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        return name, path, args, kwargs


def _token_field(model: type[models.Model], field: str | None) -> str:
    if field is not None:
        return field
    names = [f.name for f in model._meta.concrete_fields if isinstance(f, FencingTokenField)]
    if len(names) != 1:
        raise ValueError(
            f"{model.__name__} has {len(names)} FencingTokenField columns; pass field='...' to name the one to use."
        )
    return names[0]


def fenced_update(queryset: models.QuerySet[Any], token: int, *, field: str | None = None, **values: Any) -> int:
    """Update the rows of ``queryset`` whose stored token is below ``token``, storing ``token``.

    One SQL statement, so no other writer can slip between check and write.
    Returns the number of rows updated. Raises :class:`StaleToken` when some
    matching row already carries ``token`` or a higher one (a newer holder
    wrote first); rows that do not exist are not an error.
    """
    if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
        raise ValueError(f"token must be a positive int (lock.fencing_token); got {token!r}.")
    name = _token_field(queryset.model, field)
    updated = queryset.filter(**{f"{name}__lt": token}).update(**{name: token}, **values)
    if updated:
        total = queryset.count()
        if total == updated:
            return updated
    stale = queryset.filter(**{f"{name}__gte": token}).order_by().values_list(name, flat=True)
    newest = max(stale, default=None)
    if newest is not None:
        raise StaleToken(
            f"Refused a write with fencing token {token}: {queryset.model.__name__} already holds token "
            f"{newest} from a newer lock holder.",
            token=token,
            stored=newest,
        )
    return updated


class FencedQuerySet(models.QuerySet):
    """A queryset with :meth:`fenced_update`."""

    def fenced_update(self, token: int, *, field: str | None = None, **values: Any) -> int:
        """See :func:`django_redlock.fencing.fenced_update`."""
        return fenced_update(self, token, field=field, **values)
