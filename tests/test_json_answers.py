"""423 / 503 / 500 answers as the client asks (HTML, JSON, RFC 9457 problem details), and REST
framework views answered by REST framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory

from django_redlock import get_lock_manager, redlock
from django_redlock.adapters.answers import HTML, JSON, PROBLEM_JSON, preferred_type, problem_type
from tests.conftest import eventually

ROOT = Path(__file__).resolve().parent.parent
LOCKED_TEXT = "Someone else is working on this right now. Please try again shortly."
UNAVAILABLE_TEXT = "The lock service cannot be reached right now. Please try again shortly."
LOST_TEXT = (
    "The lock this request held was lost before its work was done, so the work may have overlapped "
    "another. Please check the outcome before trying again."
)


def hold(resource):
    return get_lock_manager().acquire(resource, 4)


# -- negotiation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/json", JSON),
        ("application/problem+json", PROBLEM_JSON),
        ("application/vnd.api+json", JSON),  # another +json type: plain JSON
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", HTML),  # a browser
        ("application/json;q=0.5, text/html", HTML),
        ("application/json, text/html;q=0.9", JSON),
        ("text/html, application/json", HTML),  # a tie: the one listed first
        ("application/json, text/html", JSON),
        ("application/problem+json, application/json;q=0.9", PROBLEM_JSON),
        ("application/json, application/problem+json;q=0.9", JSON),
        ("application/problem+json;q=0.8, application/json;q=0.9, */*;q=0.1", JSON),
        ("*/*", HTML),
        ("", HTML),
        ("application/*", JSON),
        ("application/problem+json;q=0, application/*", JSON),  # refusing problem details is not refusing JSON
        ("application/*, application/problem+json", PROBLEM_JSON),  # the exact range beats the wildcard
        ("*/*, application/json", JSON),
        ("text/*;q=0.5, */*;q=0.1", HTML),
        ("text/html;q=0, */*", JSON),  # HTML refused: its own range says q=0
        ("application/json;q=0, application/problem+json;q=0, text/html;q=0.1", HTML),
        ("application/json;q=0", HTML),  # nothing acceptable: the first offered
        ("image/png", HTML),
        ("APPLICATION/JSON", JSON),  # media types are case-insensitive
        ("application/json; charset=utf-8; q=0.9, text/html;q=0.8", JSON),
        ("application/json;q=oops, text/html;q=0.1", HTML),  # an unreadable q counts as 0
        ("application/json;q=7, text/html", JSON),  # out of range: 1 at most; listed first
        ("garbage, ;;, application/json", JSON),
    ],
)
def test_the_client_s_preferred_type_honours_q_values_and_wildcards(accept, expected):
    request = RequestFactory().get("/", headers={"Accept": accept} if accept else {})
    assert preferred_type(request) == expected


def test_a_rest_framework_request_is_never_offered_html():
    request = RequestFactory().get("/", headers={"Accept": "text/html, application/problem+json;q=0.5"})
    request._redlock_api = True
    assert preferred_type(request) == PROBLEM_JSON
    request = RequestFactory().get("/", headers={"Accept": "text/html"})
    request._redlock_api = True
    assert preferred_type(request) == JSON


# -- Django views --------------------------------------------------------------------


@pytest.mark.usefixtures("redlock_settings")
@pytest.mark.parametrize(
    "accept",
    ["application/json", "application/vnd.api+json", "application/json, text/html;q=0.9"],
)
def test_a_json_client_gets_the_json_body_it_always_got(accept):
    lock = hold("invoice-21")
    response = Client().get("/pay/21/", HTTP_ACCEPT=accept)
    lock.release()
    assert response.status_code == 423 and response["Content-Type"] == "application/json"
    assert response["Vary"] == "Accept"  # caches keep the forms apart
    seconds = int(response["Retry-After"])
    assert 1 <= seconds <= 4
    assert response.json() == {"detail": LOCKED_TEXT, "code": "locked", "retry_after": seconds}


@pytest.mark.usefixtures("redlock_settings")
@pytest.mark.parametrize("accept", ["text/html,application/xhtml+xml,*/*;q=0.8", "*/*", "", "application/json;q=0.5, text/html"])
def test_browsers_and_anything_else_get_the_html_page(accept):
    lock = hold("invoice-23")
    response = Client().get("/pay/23/", **({"HTTP_ACCEPT": accept} if accept else {}))
    lock.release()
    assert response.status_code == 423 and response["Content-Type"] == "text/html; charset=utf-8"
    page = response.content.decode()
    assert "<title>423 Locked</title>" in page and f"<p>{LOCKED_TEXT}</p>" in page and '<html lang="en-us">' in page


@pytest.mark.usefixtures("redlock_settings")
def test_a_problem_json_client_gets_rfc_9457_problem_details_for_423():
    lock = hold("invoice-24")
    response = Client().get("/pay/24/", HTTP_ACCEPT="application/problem+json")
    lock.release()
    assert response.status_code == 423 and response["Content-Type"] == "application/problem+json"
    seconds = int(response["Retry-After"])
    assert json.loads(response.content) == {
        "type": problem_type("locked"),
        "title": "Locked",
        "status": 423,
        "detail": LOCKED_TEXT,
        "code": "locked",
        "retry_after": seconds,
    }
    assert problem_type("locked") == "about:blank"  # no page configured: no link to a page that may not exist


@pytest.mark.usefixtures("redlock_settings")
def test_problem_types_link_the_configured_page(settings):
    base = "https://docs.example.com/django-redlock/json_apis.html"
    settings.REDLOCK = {**settings.REDLOCK, "PROBLEM_TYPE_BASE": base}
    lock = hold("invoice-25")
    response = Client().get("/pay/25/", HTTP_ACCEPT="application/problem+json")
    lock.release()
    assert response.status_code == 423 and json.loads(response.content)["type"] == f"{base}#problem-locked"
    assert problem_type("lock_service_unavailable") == f"{base}#problem-lock-service-unavailable"
    assert problem_type("invalid_lock_key") == f"{base}#problem-invalid-lock-key"


@pytest.mark.parametrize("base", ["docs.example.com/json_apis.html", "https://x.example/p#frag", "", 42, "https://x.example/a b"])
def test_a_problem_type_base_that_is_no_absolute_url_is_a_settings_error(settings, base):
    from django_redlock.checks import check_settings

    settings.REDLOCK = {"PROBLEM_TYPE_BASE": base}
    errors = [e for e in check_settings() if "PROBLEM_TYPE_BASE" in e.msg]
    assert [e.id for e in errors] == ["django_redlock.E002"]
    assert errors[0].msg == (
        "REDLOCK['PROBLEM_TYPE_BASE'] must be None or an absolute URL without '#' (the page that describes the "
        f"problem types, e.g. 'https://docs.example.com/django-redlock/json_apis.html'); got {base!r}."
    )


def test_nodes_down_is_503_in_json_and_problem_json_without_node_addresses(redlock_settings, servers):
    for s in servers[:3]:
        s.kill()
    response = Client().get("/pay/22/", HTTP_ACCEPT="application/json")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.json() == {"detail": UNAVAILABLE_TEXT, "code": "lock_service_unavailable", "retry_after": 1}
    assert "127.0.0.1" not in response.content.decode()

    response = Client().get("/pay/22/", HTTP_ACCEPT="application/problem+json")
    assert response.status_code == 503 and response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content) == {
        "type": problem_type("lock_service_unavailable"),
        "title": "Lock service unavailable",
        "status": 503,
        "detail": UNAVAILABLE_TEXT,
        "code": "lock_service_unavailable",
        "retry_after": 1,
    }
    assert "127.0.0.1" not in response.content.decode()


@pytest.fixture
def patient(redlock_settings):
    """A node timeout that a loaded machine's first connections meet (the suite's is 50 ms)."""
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "NODE_TIMEOUT": 0.5}


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize(
    ("accept", "content_type"),
    [("application/problem+json", PROBLEM_JSON), ("application/json", JSON), ("text/html", "text/html; charset=utf-8")],
)
def test_a_lost_lock_is_500_in_the_type_asked(accept, content_type):
    @redlock("lost-answer-{pk}", ttl=0.3)
    def view(request, pk):
        eventually(lambda: not get_lock_manager().is_locked(f"lost-answer-{pk}"), 30)
        return HttpResponse("body-answer")

    response = view(RequestFactory().post("/", headers={"Accept": accept}), pk=1)
    assert response.status_code == 500 and response["Content-Type"] == content_type
    assert "Retry-After" not in response
    if content_type == PROBLEM_JSON:
        assert json.loads(response.content) == {
            "type": problem_type("lock_lost"),
            "title": "Lock lost",
            "status": 500,
            "detail": LOST_TEXT,
            "code": "lock_lost",
        }
    elif content_type == JSON:
        assert json.loads(response.content) == {"detail": LOST_TEXT, "code": "lock_lost"}
    else:
        assert f"<p>{LOST_TEXT}</p>" in response.content.decode()


def test_the_answers_do_not_import_rest_framework():
    """A project without REST framework in use never imports it (it may not be installed)."""
    script = (
        "import sys, django\n"
        "django.setup()\n"
        "from django.test import RequestFactory\n"
        "from django_redlock import decorators, admin, checks\n"
        "from django_redlock.adapters.answers import locked_response, lost_response\n"
        "from django_redlock.exceptions import LockLost, LockNotAcquired\n"
        "request = RequestFactory().get('/', headers={'Accept': 'application/problem+json'})\n"
        "assert locked_response(request, LockNotAcquired('x')).status_code == 423\n"
        "assert lost_response(request, LockLost('x')).status_code == 500\n"
        "print(sorted(m for m in sys.modules if m.startswith('rest_framework')))\n"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- Django REST framework -------------------------------------------------------------

rest_framework = pytest.importorskip("rest_framework", reason="djangorestframework is not installed")


@pytest.fixture
def api(redlock_settings, settings):
    """The REST framework test views, with REST framework's templates for the browsable API."""
    settings.ROOT_URLCONF = "tests.urls_api"
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "rest_framework"]
    settings.REST_FRAMEWORK = {}  # REST framework's own exception handler
    return Client()


LOCKED_VIEWS = [
    ("post", "/api/invoice/6/", "invoice-6"),  # @redlock on an APIView method
    ("post", "/api/refund/6/", "refund-6"),  # @redlock under @api_view
    ("get", "/api/ledger/6/", "ledger-6"),  # RedlockMixin on an APIView
]


@pytest.mark.parametrize(("method", "url", "resource"), LOCKED_VIEWS)
def test_rest_framework_answers_423_in_json_with_its_own_handler(api, method, url, resource):
    assert getattr(api, method)(url).status_code == 200
    lock = hold(resource)
    response = getattr(api, method)(url)  # no Accept header: REST framework's first renderer, JSON
    lock.release()
    assert response.status_code == 423 and response["Content-Type"] == "application/json"
    seconds = int(response["Retry-After"])
    assert 1 <= seconds <= 4
    assert json.loads(response.content) == {"detail": LOCKED_TEXT, "code": "locked", "retry_after": seconds}
    assert getattr(api, method)(url).status_code == 200


@pytest.mark.parametrize(("method", "url", "resource"), LOCKED_VIEWS)
def test_rest_framework_answers_a_browser_with_the_browsable_api(api, method, url, resource):
    lock = hold(resource)
    response = getattr(api, method)(url, HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    lock.release()
    assert response.status_code == 423 and response["Content-Type"] == "text/html; charset=utf-8"
    page = response.content.decode()
    assert "Django REST framework" in page and "423 Locked" in page  # the browsable API's page
    assert LOCKED_TEXT in page and "Retry-After" in page


def test_rest_framework_s_exception_handler_gets_a_rest_framework_exception(api, settings):
    """A project's own handler sees an APIException subclass with the status and the wait."""
    from rest_framework.exceptions import APIException

    from django_redlock.rest_framework import Locked

    seen = []

    def handler(exc, context):
        from rest_framework.views import exception_handler

        seen.append(exc)
        return exception_handler(exc, context)

    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": handler}
    lock = hold("invoice-7")
    response = api.post("/api/invoice/7/")
    lock.release()
    assert response.status_code == 423
    (exc,) = seen
    assert isinstance(exc, Locked) and isinstance(exc, APIException)
    assert exc.status_code == 423 and exc.wait == int(response["Retry-After"]) and str(exc) == LOCKED_TEXT
    assert exc.detail["code"] == "locked" and exc.detail["retry_after"] == exc.wait


def test_the_mixin_lets_rest_framework_refuse_a_client_first(api):
    """Authentication and permissions run before the lock's answer: no 423 to who may not ask."""
    lock = hold("ledger-8")
    response = api.get("/api/private-ledger/8/")
    lock.release()
    assert response.status_code == 403 and "Retry-After" not in response


def test_nodes_down_is_503_from_rest_framework(api, servers):
    for s in servers[:3]:
        s.kill()
    for method, url, _resource in LOCKED_VIEWS:
        response = getattr(api, method)(url)
        assert response.status_code == 503 and response["Retry-After"] == "1", url
        assert json.loads(response.content) == {
            "detail": UNAVAILABLE_TEXT,
            "code": "lock_service_unavailable",
            "retry_after": 1,
        }


def test_a_lock_taken_by_hand_is_answered_through_our_exception_handler(api, settings):
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}
    lock = hold("credit-6")
    response = api.post("/api/credit/6/")
    lock.release()
    assert response.status_code == 423 and int(response["Retry-After"]) >= 1
    assert json.loads(response.content)["code"] == "locked"
    assert api.post("/api/credit/6/").json() == {"credited": 6}


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize("accept", ["application/json", "text/html"])
def test_a_mixin_api_view_whose_lock_was_lost_is_500_from_rest_framework(api, accept):
    response = api.get("/api/outliving-ledger/9/", HTTP_ACCEPT=accept)
    assert response.status_code == 500
    if accept == "application/json":
        assert response["Content-Type"] == "application/json"
        assert json.loads(response.content) == {"detail": LOST_TEXT, "code": "lock_lost"}
    else:
        page = response.content.decode()
        assert "Django REST framework" in page and LOST_TEXT in page
    assert '"ledger"' not in response.content.decode()  # the view's own answer is discarded
