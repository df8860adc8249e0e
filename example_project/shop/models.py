from django.db import models

from django_redlock.fencing import FencedQuerySet, FencingTokenField


class Invoice(models.Model):
    """A row protected by a lock *and* by fencing: the database refuses stale writers."""

    number = models.CharField(max_length=20, unique=True)
    status = models.CharField(max_length=20, default="open")
    note = models.CharField(max_length=200, blank=True)
    fencing_token = FencingTokenField()

    objects = FencedQuerySet.as_manager()

    def __str__(self) -> str:
        return self.number
