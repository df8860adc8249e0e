"""The test settings on PostgreSQL (used by test_fencing_orm.py's PostgreSQL run)."""

import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("REDLOCK_TEST_PG_PORT", "5432"),
    }
}
