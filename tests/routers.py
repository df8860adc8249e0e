"""Database routers for the tests."""

from __future__ import annotations

from typing import Any


class PrimaryReplicaRouter:
    """Django's documented primary/replica pattern: reads from "replica", writes to "default"."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"
