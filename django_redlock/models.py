"""No table holds locks: the Redis nodes are the truth.

``Lock`` is an unmanaged model without a table. It exists so the admin can
list a "Locks" page under the app and so that its permissions are real,
assignable ones: ``view_lock`` to see live locks, ``release_lock`` to
force-release them.
"""

from django.db import models
from django.utils.translation import gettext_lazy as _


class Lock(models.Model):
    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("release_lock", _("Can force-release locks"))]
        verbose_name = _("lock")
        verbose_name_plural = _("locks")

    def __str__(self) -> str:  # pragma: no cover - never instantiated from a table
        return "lock"
