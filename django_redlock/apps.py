"""The Django app config: its name, verbose name and the system checks it loads when ready."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RedlockConfig(AppConfig):
    name = "django_redlock"
    verbose_name = _("Redlock")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_redlock import checks  # noqa: F401  (registers the system checks)
