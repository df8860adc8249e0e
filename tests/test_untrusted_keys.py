"""Lock keys built from what a client sends: a name no lock may have is the client's error (400,
answered as the client asks, logged as a warning), never a 500 and never a node's failure."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import AsyncClient, Client

from django_redlock import get_lock_manager

pytestmark = [pytest.mark.usefixtures("redlock_settings"), pytest.mark.urls("tests.urls_untrusted")]

VIEWS = ["/doc/", "/doc-async/", "/doc-mixin/", "/doc-mixin-async/"]
API_VIEWS = ["/api/doc/", "/api/doc-fn/", "/api/doc-mixin/"]
#: Over 1,024 characters, a newline, a control character: as they arrive in a URL.
NAMES = ["x" * 1100, "a%0Ab", "a%01b"]
TEXT = "This request names a lock that cannot be taken: its name is too long or holds a control character."


def errors_logged(caplog):
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", NAMES, ids=["long", "newline", "control"])
@pytest.mark.parametrize("view", VIEWS)
def test_a_url_kwarg_no_lock_may_name_is_answered_400(view, name, caplog):
    caplog.set_level(logging.INFO)
    response = Client().get(f"{view}{name}/")
    assert response.status_code == 400, response.content[:300]
    assert response["Content-Type"].startswith("text/html") and TEXT in response.content.decode()
    assert errors_logged(caplog) == []
    assert [r.levelno for r in caplog.records if r.name == "django.request"] == [logging.WARNING]
    assert Client().get(f"{view}fine/").status_code == 200  # the view works for a name a lock may have


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize(("accept", "kind"), [("application/json", "application/json"),
                                               ("application/problem+json", "application/problem+json")])
def test_the_400_is_in_the_type_the_client_asks(view, accept, kind, caplog):
    response = Client().get(f"{view}a%0Ab/", HTTP_ACCEPT=accept)
    assert response.status_code == 400 and response["Content-Type"] == kind
    body = response.json()
    assert body["detail"] == TEXT and body["code"] == "invalid_lock_key"
    if kind == "application/problem+json":
        assert body["status"] == 400 and body["type"] == "about:blank"
    assert "Accept" in response["Vary"]
    assert errors_logged(caplog) == []


async def test_the_async_view_answers_400_under_asgi(caplog):
    response = await AsyncClient().get("/doc-async/a%0Ab/")
    assert response.status_code == 400
    response = await AsyncClient().get("/doc-mixin-async/a%0Ab/")
    assert response.status_code == 400
    assert errors_logged(caplog) == []


@pytest.mark.parametrize("name", NAMES, ids=["long", "newline", "control"])
@pytest.mark.parametrize("view", API_VIEWS)
def test_rest_framework_views_answer_400_through_rest_framework(view, name, caplog):
    response = Client().get(f"{view}{name}/", HTTP_ACCEPT="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {"detail": TEXT, "code": "invalid_lock_key"}
    assert errors_logged(caplog) == []


def test_a_json_body_with_a_lone_surrogate_is_400_not_a_lock_service_outage(caplog):
    """It once answered 503 "lock service unavailable", with every node reported down."""
    body = '{"order": "\\ud800"}'  # valid JSON: json.loads gives a lone surrogate
    response = Client().post("/order/", body, content_type="application/json", HTTP_ACCEPT="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == "invalid_lock_key"
    assert errors_logged(caplog) == []
    assert Client().post("/order/", '{"order": "7"}', content_type="application/json").status_code == 200


def test_a_plain_function_raises_the_value_error_naming_the_resource():
    from django_redlock import redlock
    from django_redlock.exceptions import InvalidResource

    @redlock("job-{name}")
    def job(name):
        return name

    with pytest.raises(InvalidResource, match="resource must not contain control characters"):
        job("a\nb")
    assert job("fine") == "fine"
    assert not get_lock_manager().is_locked("job-fine")


def test_more_resources_than_a_lock_may_take_from_a_body_is_400(caplog):
    body = json.dumps({"items": list(range(1001))})
    response = Client().post("/items/", body, content_type="application/json", HTTP_ACCEPT="application/json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_lock_key"
    assert errors_logged(caplog) == []
    assert Client().post("/items/", '{"items": [1, 2]}', content_type="application/json").status_code == 200
