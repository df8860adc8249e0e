"""Models used by the tests (the test app has no migrations: tables are created directly)."""

from django.db import models

from django_redlock.fencing import FencedQuerySet, FencingTokenField


class Invoice(models.Model):
    number = models.CharField(max_length=20)
    status = models.CharField(max_length=20, default="open")
    fencing_token = FencingTokenField()

    objects = FencedQuerySet.as_manager()

    class Meta:
        app_label = "tests"


class Reading(models.Model):
    """A table whose token column allows NULL (a column added to existing rows, say)."""

    value = models.IntegerField(default=0)
    fencing_token = FencingTokenField(null=True, default=None)

    objects = FencedQuerySet.as_manager()

    class Meta:
        app_label = "tests"
