"""Sphinx configuration for the django-redlock docs."""

import os
import socket
import sys
from importlib import metadata

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

project = "django-redlock"
author = "django-redlock contributors"
copyright = "2026, django-redlock contributors"
try:
    release = metadata.version("django-redlock")
except metadata.PackageNotFoundError:  # building from a plain checkout
    from django_redlock import __version__ as release
version = ".".join(release.split(".")[:2])

extensions = ["sphinx.ext.autodoc", "sphinx.ext.intersphinx", "sphinx.ext.viewcode"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "Redlock for Django, with fencing tokens", "fixed_sidebar": True}


def _online(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=1.5).close()
        return True
    except OSError:
        return False


# Links to the Python and Django docs when the build machine can reach them
# (an offline build must still pass with warnings as errors).
intersphinx_mapping = {}
if os.environ.get("DOCS_OFFLINE") != "1" and _online("docs.python.org"):
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "django": ("https://docs.djangoproject.com/en/stable/", "https://docs.djangoproject.com/en/stable/_objects/"),
    }


def setup(app):
    app.add_crossref_type("setting", "setting", indextemplate="pair: %s; setting")
