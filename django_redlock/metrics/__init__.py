"""Lock metrics for Prometheus and OpenTelemetry, fed by the engine's hooks.

:class:`PrometheusHooks` needs ``prometheus_client`` (``pip install "django-redlock[prometheus]"``),
:class:`OpenTelemetryHooks` needs ``opentelemetry-api`` (``pip install
"django-redlock[opentelemetry]"``). Each is a :class:`~django_redlock.core.Hooks`: list it in
``REDLOCK["HOOKS"]``, or pass it to a manager (``LockManager(nodes, hooks=PrometheusHooks())``).
See :doc:`metrics`. Importing this package loads neither library; each class loads its own on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'django_redlock.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
