"""The test settings with a node timeout long enough for a test to hold a node's bytes back at a
proxy while it acts (sends a signal): the held command does not time out meanwhile."""

from tests.settings import *  # noqa: F403

REDLOCK = {**REDLOCK, "NODE_TIMEOUT": 5.0, "TTL": 60.0}  # noqa: F405
