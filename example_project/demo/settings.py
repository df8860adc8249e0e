"""Settings of the django-redlock example project.

Five local Redis masters on ports 7101-7105 (``DEMO_REDIS_PORTS`` to change
them); ``DEMO_SINGLE_NODE=1`` keeps only the first one, to see check W001.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "django-redlock-example-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "demo.urls"
WSGI_APPLICATION = "demo.wsgi.application"
ASGI_APPLICATION = "demo.asgi.application"

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

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DEMO_DB", BASE_DIR / "db.sqlite3")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# -- django-redlock -----------------------------------------------------------
REDIS_PORTS = [int(p) for p in os.environ.get("DEMO_REDIS_PORTS", "7101,7102,7103,7104,7105").split(",")]
if os.environ.get("DEMO_SINGLE_NODE") == "1":
    REDIS_PORTS = REDIS_PORTS[:1]  # `manage.py check` now shows django_redlock.W001

# run_demo.py starts them with appendonly yes + appendfsync always: declared so, they vote right after a restart.
REDLOCK_NODES = [{"URL": f"redis://127.0.0.1:{port}/0", "FSYNC_ALWAYS": True} for port in REDIS_PORTS]
REDLOCK = {
    "TTL": 15,
    "LABEL": "example-project",
    "LOCKED_RESPONSE": "shop.views.locked",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {"django_redlock": {"handlers": ["console"], "level": "INFO"}},
}
