"""Fencing on the storage side, with the Django ORM.

A lock alone cannot stop a holder that was paused (GC, swap, a stopped VM)
past its validity from writing. The fencing token can: the storage keeps the
highest token it has accepted and refuses writes that carry a lower one. This
module does that in the database, in one transaction, for all the rows of a
queryset or none of them::

    class Invoice(models.Model):
        fencing_token = FencingTokenField()
        objects = FencedQuerySet.as_manager()

    with manager.lock(f"invoice-{pk}") as lock:
        Invoice.objects.filter(pk=pk).fenced_update(lock.fencing_token, status="paid")

``fenced_update`` raises :class:`StaleToken` when a newer holder already wrote, and
:class:`FencingUnverifiable` where its check could not see a newer holder's write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import Q

from django_redlock.exceptions import FencingUnverifiable, StaleToken

__all__ = ["FencedQuerySet", "FencingTokenField", "FencingUnverifiable", "StaleToken", "fenced_update"]


if TYPE_CHECKING:  # generic in django-stubs only: Django's field classes take no [...] at run time
    from django.db.models.expressions import Combinable

    _BigIntegerField = models.BigIntegerField[float | int | str | Combinable, int]  # as BigIntegerField's
else:
    _BigIntegerField = models.BigIntegerField


class FencingTokenField(_BigIntegerField):
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


# Isolation levels at which every statement of a transaction reads the snapshot of its first one.
_SNAPSHOT_LEVELS = ("repeatable read", "serializable")


def _outer_snapshot_level(alias: str) -> str | None:
    """The isolation level of the enclosing transaction on ``alias`` if its snapshot may predate this call.

    A transaction fenced_update opens itself takes its snapshot at its first statement, inside the
    call: it sees every write committed before the call. An enclosing transaction at REPEATABLE READ
    or SERIALIZABLE reads the snapshot of its own first statement, which may be older. PostgreSQL
    hides from it the rows committed since (and its SERIALIZABLE lets such a write commit unless the
    newer holder's transaction was SERIALIZABLE too and read the same rows). MySQL is answered by
    the locking check below; SQLite refuses a write after a read that another writer overtook.
    """
    connection = connections[alias]
    if connection.get_autocommit() or connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        level = str(cursor.fetchone()[0])
    return level if level in _SNAPSHOT_LEVELS else None


def fenced_update(queryset: models.QuerySet[Any], token: int, *, field: str | None = None, **values: Any) -> int:
    """Update every row of ``queryset`` and store ``token`` in it, or none of them.

    A row accepts the write when its stored token is at most ``token`` (the
    same holder may write again) or NULL (no token yet, as 0). If any row holds
    a higher token, a newer holder already wrote: nothing is written and
    :class:`StaleToken` is raised. Returns the number of rows updated; rows
    that do not exist are not an error.

    Every statement runs on one database: the one ``queryset.using()`` names,
    else the router's ``db_for_write`` for the model, never a read replica.
    Outside a transaction it opens its own (safe at every isolation level).
    Inside one on PostgreSQL, that transaction must run at READ COMMITTED, the
    default: at REPEATABLE READ or SERIALIZABLE its snapshot may be older than
    a newer holder's write, and :class:`~django_redlock.exceptions.FencingUnverifiable`
    is raised before anything is written.
    """
    if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
        raise ValueError(f"token must be a positive int (lock.fencing_token); got {token!r}.")
    name = _token_field(queryset.model, field)
    accepts = Q(**{f"{name}__lte": token}) | Q(**{f"{name}__isnull": True})
    # Django's rule for a write (select_for_update() marks the queryset as one): the alias pinned
    # with using(), else the router's db_for_write. Pinned, every statement below goes there.
    alias = queryset.select_for_update().db
    queryset = queryset.using(alias)
    level = _outer_snapshot_level(alias)
    if level is not None:
        raise FencingUnverifiable(
            f"Refused a write with fencing token {token} to {queryset.model.__name__}: it runs inside a "
            f"{level.upper()} transaction on database {alias!r}, whose snapshot may be older than a newer "
            "lock holder's write and would hide it; nothing was written. Call fenced_update() outside "
            "transaction.atomic() (it opens its own transaction), or run this transaction at READ COMMITTED."
        )
    connection = connections[alias]
    features = connection.features
    of = ("self",) if features.has_select_for_update_of else ()
    with transaction.atomic(using=alias):
        if features.has_select_for_update:
            # Lock the rows in one order first: overlapping fenced updates queue instead of deadlocking.
            list(queryset.select_for_update(of=of).order_by("pk").values_list("pk", flat=True))
        updated = queryset.filter(accepts).update(**{name: token}, **values)
        # Checked after the write, in the same transaction: a row that a newer holder wrote
        # meanwhile (or that appeared) is seen here, and raising rolls the whole update back.
        newer = queryset.filter(**{f"{name}__gt": token})
        if connection.vendor == "mysql":
            # InnoDB answers a locking read from the newest committed rows, a plain one at
            # REPEATABLE READ from the transaction's snapshot.
            newer = newer.select_for_update(of=of)
        newest = newer.order_by(f"-{name}").values_list(name, flat=True).first()
        if newest is not None:
            raise StaleToken(
                f"Refused a write with fencing token {token}: {queryset.model.__name__} already holds token "
                f"{newest} from a newer lock holder; nothing was written.",
                token=token,
                stored=newest,
            )
    return updated


class FencedQuerySet(models.QuerySet[Any]):
    """A queryset with :meth:`fenced_update`."""

    def fenced_update(self, token: int, *, field: str | None = None, **values: Any) -> int:
        """See :func:`django_redlock.fencing.fenced_update`."""
        return fenced_update(self, token, field=field, **values)
