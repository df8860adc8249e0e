"""The test settings, with the app's log lines written to stderr as a project's console handler would."""

from tests.settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {"django_redlock": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
