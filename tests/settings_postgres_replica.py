"""PostgreSQL with a primary and a lagging streaming standby behind a primary/replica router."""

import os

from tests.settings_postgres import *  # noqa: F403
from tests.settings_postgres import DATABASES

DATABASES = {
    "default": DATABASES["default"],
    "replica": {
        **DATABASES["default"],
        "PORT": os.environ.get("REDLOCK_TEST_PG_STANDBY_PORT", "5433"),
        "TEST": {"MIRROR": "default"},  # the standby receives the test database from the primary
    },
}
DATABASE_ROUTERS = ["tests.routers.PrimaryReplicaRouter"]
