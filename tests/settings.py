"""Django settings for the test suite. REDLOCK_NODES is filled in by fixtures."""

import os

SECRET_KEY = "django-redlock-tests"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "tests",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

STATIC_URL = "/static/"

# Filled per test by the ``redlock_settings`` fixture; unreachable by default so
# that a test forgetting the fixture fails loudly instead of touching a real server.
REDLOCK_NODES: list = [u for u in os.environ.get("REDLOCK_TEST_NODES", "").split(",") if u]
# The suite's redis-server processes are seconds old: without fsync-always they
# would sit out for the delayed-restart window, so the rule is off here (and
# tested on its own in test_restart_guard.py).
REDLOCK = {"NODE_TIMEOUT": 0.05, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_redlock": {"handlers": ["null"], "level": "DEBUG", "propagate": True}},
}
