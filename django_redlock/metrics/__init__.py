"""Lock metrics for Prometheus and OpenTelemetry, fed by the engine's hooks.

:class:`PrometheusHooks` needs ``prometheus_client`` (``pip install "django-redlock[prometheus]"``),
:class:`OpenTelemetryHooks` needs ``opentelemetry-api`` (``pip install
"django-redlock[opentelemetry]"``). Each is a :class:`~django_redlock.core.Hooks`: list it in
``REDLOCK["HOOKS"]``, or pass it to a manager (``LockManager(nodes, hooks=PrometheusHooks())``).
See :doc:`metrics`. Importing this package loads neither library; each class loads its own on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_redlock import lazy

__all__ = ["MetricsHooks", "OpenTelemetryHooks", "PrometheusHooks"]

_HOMES = {
    "MetricsHooks": "django_redlock.metrics.common",
    "OpenTelemetryHooks": "django_redlock.metrics.opentelemetry",
    "PrometheusHooks": "django_redlock.metrics.prometheus",
}

if TYPE_CHECKING:
    from django_redlock.metrics.common import MetricsHooks
    from django_redlock.metrics.opentelemetry import OpenTelemetryHooks
    from django_redlock.metrics.prometheus import PrometheusHooks

__getattr__, __dir__ = lazy.exports(__name__, _HOMES, globals())
