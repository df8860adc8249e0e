"""423 / 503 answers in JSON for API clients and Django REST framework views."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from django_redlock import get_lock_manager

pytestmark = pytest.mark.usefixtures("redlock_settings")


def hold(resource):
    return get_lock_manager().acquire(resource, 4)


@pytest.mark.parametrize(
    ("accept", "json_answer"),
    [
        ("application/json", True),
        ("application/problem+json", True),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", False),  # a browser
        ("application/json;q=0.5, text/html", False),
        ("application/json, text/html;q=0.9", True),
        ("*/*", False),
        ("", False),
    ],
)
def test_a_client_preferring_json_gets_json(accept, json_answer):
    lock = hold("invoice-21")
    response = Client().get("/pay/21/", HTTP_ACCEPT=accept)
    lock.release()
    assert response.status_code == 423 and 1 <= int(response["Retry-After"]) <= 4
    if json_answer:
        body = response.json()
        assert response["Content-Type"] == "application/json"
        assert body["code"] == "locked" and body["retry_after"] == int(response["Retry-After"])
        assert "Someone else is working on this" in body["detail"]
    else:
        assert response["Content-Type"].startswith("text/html")


def test_nodes_down_is_503_in_json_without_node_addresses(servers):
    for s in servers[:3]:
        s.kill()
    response = Client().get("/pay/22/", HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    body = response.json()
    assert body["code"] == "lock_service_unavailable" and "Retry-After" in response
    assert "127.0.0.1" not in response.content.decode()


rest_framework = pytest.importorskip("rest_framework", reason="djangorestframework is not installed")


@pytest.mark.urls("tests.urls_api")
def test_rest_framework_views_answer_423_in_json(settings):
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}
    client = Client()
    assert client.post("/api/invoice/5/").json() == {"paid": 5}
    for url, resource in [
        ("/api/invoice/6/", "invoice-6"),  # @redlock on an APIView method
        ("/api/refund/6/", "refund-6"),  # @redlock under @api_view
        ("/api/credit/6/", "credit-6"),  # a lock taken by hand: the exception handler
    ]:
        lock = hold(resource)
        response = client.post(url)  # no Accept header: a REST framework view answers JSON anyway
        lock.release()
        assert response.status_code == 423, url
        assert json.loads(response.content)["code"] == "locked" and int(response["Retry-After"]) >= 1
        assert client.post(url).status_code == 200
