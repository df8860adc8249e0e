"""Drive the example project with Django's test client (run by test_example_project.py in its own process)."""

import os
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"
sys.path.insert(0, str(EXAMPLE))
os.environ["DJANGO_SETTINGS_MODULE"] = "demo.settings"

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from django_redlock import get_lock_manager  # noqa: E402

setup_test_environment()
call_command("migrate", verbosity=0)
client = Client()
index = client.get("/").content.decode()
ports = os.environ["DEMO_REDIS_PORTS"]
assert f"DEMO_REDIS_PORTS={ports} .venv/bin/python example_project/manage.py redlock list" in index

manager = get_lock_manager()
report = manager.acquire("report-1", ttl=10)
invoice = manager.acquire("invoice-1", ttl=10)
for url in ("/slow/1/", "/async/1/", "/cbv/1/"):
    response = client.get(url)
    assert response.status_code == 423, (url, response.status_code)
    assert 1 <= int(response["Retry-After"]) <= 10
    assert b"423 Locked" in response.content
    assert b"127.0.0.1" not in response.content and b":71" not in response.content  # no node addresses
    for accept in ("application/json", "application/problem+json"):  # API clients: the package's answer
        response = client.get(url, HTTP_ACCEPT=accept)
        assert response.status_code == 423 and response["Content-Type"] == accept, (url, accept)
        assert response.json()["code"] == "locked" and response.json()["retry_after"] == int(response["Retry-After"])

get_user_model().objects.create_superuser("demo", "demo@example.com", "pw")
client.login(username="demo", password="pw")
page = client.get("/admin/django_redlock/lock/").content.decode()
assert "report-1" in page and "invoice-1" in page and "held by a quorum" in page
report.release()
invoice.release()

page = client.get("/fencing/").content.decode()
assert "<b>refused</b>" in page, page
print("example project OK")
