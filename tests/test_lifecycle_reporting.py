"""A lock lost while the code ran is reported to the code's caller, by every wrapper; a locked
command is stopped at once, even inside a blocking call.

Each body runs past its lock: it waits until the nodes no longer hold the key (ttl 0.3 s), then
returns. ``with manager.lock()`` raises ``LockLost`` then; so must ``@redlock`` (a plain function
raises, a view answers 500, in JSON to a JSON client), ``RedlockMixin`` and REST framework views.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.test import AsyncRequestFactory, RequestFactory
from django.views import View

from django_redlock import get_async_lock_manager, get_lock_manager, redlock, redlock_command
from django_redlock.adapters.transactions import ReleasedInTransaction
from django_redlock.decorators import EXIT_LOST, RedlockMixin
from django_redlock.exceptions import LockLost
from tests.conftest import eventually

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TTL = 0.3
WAIT = 30.0


@pytest.fixture(autouse=True)
def patient(redlock_settings):
    """A node timeout that a loaded machine's first connections meet (the suite's is 50 ms)."""
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "NODE_TIMEOUT": 0.5}


def run_past_the_lock(resource: str) -> None:
    """Return once the nodes no longer hold ``resource``: the caller ran without its lock."""
    eventually(lambda: not get_lock_manager().is_locked(resource), WAIT)


async def run_past_the_lock_async(resource: str) -> None:
    manager = get_async_lock_manager()
    deadline = time.monotonic() + WAIT
    while await manager.is_locked(resource):
        assert time.monotonic() < deadline, f"{resource!r} is still locked after {WAIT} s"
        await asyncio.sleep(0.05)


def from_command_line(command: BaseCommand) -> BaseCommand:
    """``command`` as ``manage.py`` runs it (``run_from_argv``), in this process's main thread."""
    command._called_from_command_line = True
    return command


def assert_lost_answer(response, json_answer: bool) -> None:
    assert response.status_code == 500, (response.status_code, response.content)
    assert b"body-answer" not in response.content  # the body's own answer is not passed on as a success
    if json_answer:
        assert response["Content-Type"] == "application/json"
        body = json.loads(response.content)
        assert body["code"] == "lock_lost" and body["detail"]
    else:
        assert response["Content-Type"].startswith("text/html")


# -- @redlock ---------------------------------------------------------------------


def test_a_function_whose_lock_was_lost_raises_lock_lost():
    @redlock("lost-fn", ttl=TTL)
    def job() -> str:
        run_past_the_lock("lost-fn")
        return "done"

    with pytest.raises(LockLost, match="'lost-fn' was lost"):
        job()


async def test_an_async_function_whose_lock_was_lost_raises_lock_lost():
    @redlock("lost-async-fn", ttl=TTL)
    async def job() -> str:
        await run_past_the_lock_async("lost-async-fn")
        return "done"

    with pytest.raises(LockLost, match="'lost-async-fn' was lost"):
        await job()


def test_the_body_s_own_error_goes_on_when_its_lock_was_lost_too():
    @redlock("lost-raising", ttl=TTL)
    def job() -> str:
        run_past_the_lock("lost-raising")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        job()


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_a_view_whose_lock_was_lost_answers_500(accept):
    @redlock("lost-view-{pk}", ttl=TTL)
    def view(request, pk):
        run_past_the_lock(f"lost-view-{pk}")
        return HttpResponse("body-answer")

    response = view(RequestFactory().post("/", headers={"Accept": accept}), pk=1)
    assert_lost_answer(response, accept == "application/json")


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
async def test_an_async_view_whose_lock_was_lost_answers_500(accept):
    @redlock("lost-async-view-{pk}", ttl=TTL)
    async def view(request, pk):
        await run_past_the_lock_async(f"lost-async-view-{pk}")
        return JsonResponse({"body-answer": True})

    response = await view(AsyncRequestFactory().post("/", headers={"Accept": accept}), pk=2)
    assert_lost_answer(response, accept == "application/json")


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_a_class_based_view_whose_lock_was_lost_answers_500(accept):
    class Report(RedlockMixin, View):
        redlock_key = "lost-report-{pk}"
        redlock_ttl = TTL

        def post(self, request, pk):
            run_past_the_lock(f"lost-report-{pk}")
            return HttpResponse("body-answer")

    response = Report.as_view()(RequestFactory().post("/", headers={"Accept": accept}), pk=3)
    assert_lost_answer(response, accept == "application/json")


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_a_streaming_view_whose_lock_ran_out_before_it_returned_answers_500(accept):
    """The stream would outlive a lock already gone: the loss is answered, not streamed as a success."""

    @redlock("lost-stream-{pk}", ttl=TTL)
    def view(request, pk):
        run_past_the_lock(f"lost-stream-{pk}")
        return StreamingHttpResponse(iter([b"body-answer"]))

    response = view(RequestFactory().post("/", headers={"Accept": accept}), pk=4)
    assert_lost_answer(response, accept == "application/json")


async def test_an_async_streaming_view_whose_lock_ran_out_before_it_returned_answers_500():
    @redlock("lost-async-stream", ttl=TTL)
    async def view(request):
        await run_past_the_lock_async("lost-async-stream")
        return StreamingHttpResponse(iter([b"body-answer"]))

    response = await view(AsyncRequestFactory().post("/"))
    assert_lost_answer(response, False)


async def test_a_class_based_view_with_async_handlers_runs_them_under_its_lock():
    """``async def get`` on a RedlockMixin view: the handler runs while the lock is held, one
    request at a time, and a second request meanwhile is answered 423."""
    inside: list[bool] = []
    entered = asyncio.Event()
    proceed = asyncio.Event()

    class Report(RedlockMixin, View):
        redlock_key = "async-report-{pk}"

        async def get(self, request, pk):
            inside.append(await get_async_lock_manager().is_locked(f"async-report-{pk}"))
            entered.set()
            await proceed.wait()
            return HttpResponse("body-answer")

    view = Report.as_view()
    first = asyncio.ensure_future(view(AsyncRequestFactory().get("/"), pk=5))
    await asyncio.wait_for(entered.wait(), WAIT)
    second = await view(AsyncRequestFactory().get("/"), pk=5)
    proceed.set()
    response = await first
    assert inside == [True], "the handler ran without its lock"
    assert second.status_code == 423
    assert response.status_code == 200 and response.content == b"body-answer"
    assert not await get_async_lock_manager().is_locked("async-report-5")


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
async def test_a_class_based_view_with_async_handlers_whose_lock_was_lost_answers_500(accept):
    class Report(RedlockMixin, View):
        redlock_key = "lost-async-report-{pk}"
        redlock_ttl = TTL

        async def post(self, request, pk):
            await run_past_the_lock_async(f"lost-async-report-{pk}")
            return HttpResponse("body-answer")

    response = await Report.as_view()(AsyncRequestFactory().post("/", headers={"Accept": accept}), pk=6)
    assert_lost_answer(response, accept == "application/json")


def test_a_locked_function_that_returns_an_awaitable_is_refused_and_leaves_no_lock():
    """Its work would run after the release: refused, and the lock is released at once."""

    async def work() -> str:
        return "done"

    @redlock("returns-awaitable")
    def job():
        return work()

    with pytest.raises(TypeError, match="awaitable"):
        job()
    assert not get_lock_manager().is_locked("returns-awaitable")


def test_rest_framework_views_whose_lock_was_lost_answer_500_in_json(settings):
    pytest.importorskip("rest_framework")
    from rest_framework.decorators import api_view
    from rest_framework.response import Response
    from rest_framework.views import APIView

    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}

    class Invoice(APIView):
        @redlock("lost-api-{pk}", ttl=TTL)
        def post(self, request, pk):
            run_past_the_lock(f"lost-api-{pk}")
            return Response({"body-answer": pk})

    @api_view(["POST"])
    def by_hand(request, pk):
        with get_lock_manager().lock(f"lost-by-hand-{pk}", ttl=TTL):
            run_past_the_lock(f"lost-by-hand-{pk}")
        return Response({"body-answer": pk})

    for view in (Invoice.as_view(), by_hand):  # no Accept header: REST framework views answer JSON
        response = view(RequestFactory().post("/"), pk=4)
        if hasattr(response, "render"):
            response.render()
        assert_lost_answer(response, json_answer=True), view


# -- @redlock_command: stopped inside a blocking call ---------------------------------


def start_command(servers, marker, block, **env_extra):
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings")
    env.update(env_extra)
    return subprocess.Popen(
        [sys.executable, "-m", "django", "blocked", "--block", block, "--seconds", "20", "--marker", str(marker)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_by_force_release(proc, marker, blocked=lambda: True) -> tuple[str, float]:
    """Wait until the command blocks, force-release its lock; its stderr and how long it ran on."""
    try:
        # Polling another process's file: there is no event to await.
        eventually(lambda: proc.poll() is not None or (marker.exists() and "blocking" in marker.read_text()), WAIT)
        eventually(lambda: proc.poll() is not None or blocked(), WAIT)
        assert proc.poll() is None, proc.communicate()
        started = time.monotonic()
        assert get_lock_manager().force_release("command:blocked") >= 3  # an operator, from the admin
        out, err = proc.communicate(timeout=25)
        return err, time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("block", ["sleep", "socket", "lock"])
def test_a_command_is_stopped_inside_a_blocking_call_when_its_lock_is_lost(servers, tmp_path, block):
    marker = tmp_path / "blocked"
    proc = start_command(servers, marker, block)
    err, took = stop_by_force_release(proc, marker)
    assert proc.returncode == EXIT_LOST, err
    assert "Stopped: the lock 'command:blocked' was lost" in err
    assert "done" not in marker.read_text()
    # The watchdog looks every third of the 1 s ttl; the rest is the release and the exit.
    assert took < 2.5, f"the command ran on for {took:.1f} s after its lock was lost"


def test_a_command_in_a_long_postgresql_statement_is_stopped_and_the_statement_cancelled(servers, tmp_path):
    """psycopg 3 waits for the server in Python: the stop signal ends the wait, and psycopg
    cancels the statement on the server."""
    pytest.importorskip("psycopg")
    from tests.postgres import PostgresServer

    server = PostgresServer()
    if not server.available:
        pytest.skip("PostgreSQL is not installed")
    server.start()
    try:
        import psycopg

        def sleeping() -> int:
            with psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="postgres") as db:
                row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                                 " AND query LIKE 'SELECT pg_sleep%%'").fetchone()
            return row[0] if row else 0

        marker = tmp_path / "blocked"
        proc = start_command(servers, marker, "sql", DJANGO_SETTINGS_MODULE="tests.settings_postgres",
                             REDLOCK_TEST_PG_PORT=str(server.port))
        err, took = stop_by_force_release(proc, marker, blocked=lambda: sleeping() == 1)
        assert proc.returncode == EXIT_LOST, err
        assert took < 2.5, f"the command ran on for {took:.1f} s after its lock was lost"
        assert sleeping() == 0, "the statement still runs on the server"
    finally:
        server.stop()


def test_the_command_s_signal_handlers_are_restored():
    @redlock_command(key="handlers", ttl=2)
    class Command(BaseCommand):
        def handle(self, *args, **options):
            self.stdout.write(repr(signal.getsignal(signal.SIGINT)))

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out = StringIO()
    call_command(from_command_line(Command()), stdout=out, stderr=StringIO())
    assert out.getvalue().strip() != repr(before[0])  # its own handler while it ran
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    out = StringIO()
    call_command(Command(), stdout=out, stderr=StringIO())  # not from the command line: the host's handlers
    assert out.getvalue().strip() == repr(before[0])


def test_a_command_whose_lock_was_lost_in_process_exits_three():
    @redlock_command(key="lost-in-process", ttl=TTL)
    class Command(BaseCommand):
        def handle(self, *args, **options):
            get_lock_manager().force_release("lost-in-process")  # an operator, from the admin
            time.sleep(20)  # stopped by the watchdog's signal long before this ends

    started = time.monotonic()
    with pytest.raises(CommandError, match="Stopped: the lock 'lost-in-process' was lost") as info:
        call_command(from_command_line(Command()), stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == EXIT_LOST
    assert time.monotonic() - started < 2.5


# -- a lost lock's 500 rolls back the request's transaction; what is a view ------------


def atomic_request(view):
    """``view`` as Django's handler runs it under ``ATOMIC_REQUESTS`` (one transaction per request):
    resolved for the request, then wrapped by ``make_view_atomic``."""
    from django.core.handlers.base import BaseHandler
    from django.urls import ResolverMatch

    atomic = BaseHandler().make_view_atomic(view)

    def run(request):
        request.resolver_match = ResolverMatch(view, (), {})
        return atomic(request)

    return run


@pytest.mark.django_db(transaction=True)
def test_a_lost_lock_s_500_rolls_back_the_request_s_transaction(settings, monkeypatch):
    pytest.importorskip("rest_framework")
    from django.db import connection
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from tests.models import Invoice

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}

    @redlock("atomic-fn-view", ttl=TTL)
    def function_view(request):
        Invoice.objects.create(number="function")
        run_past_the_lock("atomic-fn-view")
        return HttpResponse("body-answer")

    class Mixin(RedlockMixin, View):
        redlock_key = "atomic-mixin"
        redlock_ttl = TTL

        def post(self, request):
            Invoice.objects.create(number="mixin")
            run_past_the_lock("atomic-mixin")
            return HttpResponse("body-answer")

    class ByHand(APIView):
        def post(self, request):
            with get_lock_manager().lock("atomic-by-hand", ttl=TTL):
                Invoice.objects.create(number="by-hand")
                run_past_the_lock("atomic-by-hand")
            return Response({"body-answer": True})

    for view in (function_view, Mixin.as_view(), ByHand.as_view()):
        request = RequestFactory().post("/", headers={"Accept": "application/json"})
        if getattr(view, "view_class", None) is ByHand:  # a lock taken inside the request's transaction: released before it ends
            with pytest.warns(ReleasedInTransaction, match="'atomic-by-hand' was released inside a transaction"):
                response = atomic_request(view)(request)
        else:
            response = atomic_request(view)(request)
        if hasattr(response, "render"):
            response.render()
        assert_lost_answer(response, json_answer=True)
    assert list(Invoice.objects.values_list("number", flat=True)) == []  # the work done without the lock is undone


def test_a_function_that_takes_the_request_but_is_not_the_view_raises_lock_lost():
    @redlock("lost-helper-{request.user_id}", ttl=TTL)
    def transfer(request, amount):
        run_past_the_lock(f"lost-helper-{request.user_id}")
        return {"moved": amount}

    request = RequestFactory().post("/")
    request.user_id = 7
    with pytest.raises(LockLost, match="'lost-helper-7' was lost"):
        transfer(request, 10)


@pytest.mark.parametrize("kind", ["generator", "async generator"])
def test_a_generator_function_is_refused_at_decoration(kind):
    if kind == "generator":
        def rows():
            yield 1
    else:
        async def rows():
            yield 1

    with pytest.raises(TypeError, match=r"rows\(\), a generator function.*manager\.lock\("):
        redlock("rows", ttl=TTL)(rows)


@pytest.mark.parametrize("accept", [None, "*/*"])
def test_the_mixin_on_a_rest_framework_view_answers_json_like_redlock(accept):
    pytest.importorskip("rest_framework")
    from rest_framework.response import Response
    from rest_framework.views import APIView

    class Invoice(RedlockMixin, APIView):
        redlock_key = "lost-mixin-api"
        redlock_ttl = TTL

        def get(self, request):
            run_past_the_lock("lost-mixin-api")
            return Response({"body-answer": True})

    headers = {"Accept": accept} if accept else {}
    response = Invoice.as_view()(RequestFactory().get("/", headers=headers)).render()  # by REST framework
    assert_lost_answer(response, json_answer=True)
    with get_lock_manager().lock("lost-mixin-api", ttl=5):  # held by another: 423, in JSON too
        response = Invoice.as_view()(RequestFactory().get("/", headers=headers)).render()
    assert response.status_code == 423 and response["Content-Type"] == "application/json"


# -- @redlock_command: a loss is exit 3 whatever handle() ends with; hosts keep their signals ---


def lost_command(resource: str, body, **options):
    @redlock_command(key=resource, ttl=TTL, **options)
    class Command(BaseCommand):
        def handle(self, *args, **opts):
            get_lock_manager().force_release(resource)  # an operator, from the admin
            return body(self)

    return Command()


def sleep_then_say_interrupted(command):
    try:
        time.sleep(20)  # stopped by the watchdog's signal long before this ends
    except KeyboardInterrupt:
        raise CommandError("interrupted by the user") from None


def run_past_then_fail(command):
    run_past_the_lock("lost-then-fails")
    raise ValueError("the body failed too")


@pytest.mark.parametrize(
    "resource, body, options",
    [
        ("lost-said-interrupted", sleep_then_say_interrupted, {}),
        ("lost-then-fails", run_past_then_fail, {"stop_on_lost": False}),
    ],
)
def test_a_lost_lock_exits_three_whatever_the_command_ends_with(resource, body, options):
    command = from_command_line(lost_command(resource, body, **options))
    with pytest.raises(CommandError, match=f"lock {resource!r} was lost") as info:
        call_command(command, stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == EXIT_LOST


def test_a_nested_command_s_stop_is_the_outer_lock_s_loss():
    @redlock_command(key="nested-inner", ttl=2)
    class Inner(BaseCommand):
        def handle(self, *args, **options):
            time.sleep(20)

    command = from_command_line(
        lost_command("nested-outer", lambda command: call_command(from_command_line(Inner()), stdout=StringIO()))
    )
    started = time.monotonic()
    with pytest.raises(CommandError, match="Stopped: the lock 'nested-outer' was lost") as info:
        call_command(command, stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == EXIT_LOST
    assert time.monotonic() - started < 2.5
    assert not get_lock_manager().is_locked("nested-inner")


def test_a_command_run_by_call_command_leaves_the_host_s_sigint_to_the_host():
    """An asyncio server handles SIGINT through the loop; a command it runs whose lock is lost
    must not shut it down. Without the command line the loss is reported when handle() returns."""

    async def server() -> tuple[list[str], CommandError]:
        loop = asyncio.get_running_loop()
        shutdowns: list[str] = []
        loop.add_signal_handler(signal.SIGINT, shutdowns.append, "SIGINT")
        try:
            command = lost_command("hosted", lambda: time.sleep(2))
            with pytest.raises(CommandError) as info:
                call_command(command, stdout=StringIO(), stderr=StringIO())
            for _ in range(5):
                await asyncio.sleep(0.05)  # the loop reads its wakeup fd and runs handlers that are due
            return shutdowns, info.value
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    shutdowns, error = asyncio.run(server())
    assert shutdowns == []
    assert error.returncode == EXIT_LOST and "The lock 'hosted' was lost" in str(error)


def test_a_host_s_sigterm_reaches_the_host_s_handler():
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        for command_line in (False, True):
            @redlock_command(key="host-sigterm", ttl=2)
            class Command(BaseCommand):
                def handle(self, *args, **options):
                    os.kill(os.getpid(), signal.SIGTERM)  # the host is asked to shut down
                    time.sleep(0.5)

            command = from_command_line(Command()) if command_line else Command()
            try:
                call_command(command, stdout=StringIO(), stderr=StringIO())
            except CommandError as exc:
                assert command_line and exc.returncode == 128 + signal.SIGTERM
            eventually(lambda: len(received) == 1 + command_line, WAIT)
            assert not get_lock_manager().is_locked("host-sigterm")
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_stop_never_lands_inside_the_command_s_own_lock_calls(servers):
    """A command that locks items one by one spends its time in acquire and release: the stop
    must wait until the call is done, or the item's key is left on the nodes for its ttl."""
    from tests.conftest import on_nodes

    @redlock_command(key="items", ttl=TTL)
    class Command(BaseCommand):
        def handle(self, *args, **options):
            manager = get_lock_manager()
            manager.force_release("items")  # an operator, from the admin
            while True:
                with manager.lock("items-item", ttl=30):
                    pass

    left = []
    for run in range(20):
        with pytest.raises(CommandError) as info:
            call_command(from_command_line(Command()), stdout=StringIO(), stderr=StringIO())
        assert info.value.returncode == EXIT_LOST, info.value
        holding = sum(ttl > 0 for ttl in on_nodes(servers, "pttl", "items-item"))
        if holding:
            left.append((run, holding))
            get_lock_manager().force_release("items-item")
    assert left == [], f"the item's key was left on the nodes after (run, nodes): {left}"


@pytest.mark.parametrize("call", ["acquire", "adopt"])
def test_a_stop_deferred_during_acquire_lands_after_the_caller_has_the_lock(servers, call):
    """A SIGTERM that reaches a locked command while it is inside ``acquire()`` (or ``adopt()``)
    is sent again when the call is over: not before the caller holds the lock it can release."""
    import threading

    from django_redlock.adapters.stop import Guard, Stop
    from django_redlock.core import Hooks, LockManager

    fire = []

    class Signal(Hooks):
        def nodes_seen(self, seen):  # inside the call's round: as a SIGTERM arriving then
            if fire:
                fire.clear()
                os.kill(os.getpid(), signal.SIGTERM)

    manager = LockManager(servers.urls, ttl=20, restart_window=0, node_timeout=0.5, hooks=Signal())
    token = None
    if call == "adopt":
        held = manager.acquire("deferred-item", blocking=False)
        token, resources = held.token, held.resources
    guard = Guard(threading.Event(), True)
    guard.install()
    got = None
    try:
        with pytest.raises(Stop):
            try:
                fire.append(True)
                if call == "acquire":
                    got = manager.acquire("deferred-item", blocking=False)
                else:
                    got = manager.adopt(resources, token)
                time.sleep(5)  # the stop lands here, once the caller has its lock
            finally:
                guard.disarm()
                if got is not None:
                    got.release()
    finally:
        guard.restore()
        manager.close()
    assert got is not None, "the stop came out of the call: its caller never got the lock"
    assert not get_lock_manager().is_locked("deferred-item")
