"""Celery tasks under a Redlock, run by a real worker on a real Redis broker (and eagerly).

The module starts its own redis-server as broker, result backend and event
channel (not one of the five lock nodes), then one ``celery worker`` process
(threads pool, two slots) with the suite's Django settings. Task bodies report
to the test through ``ev:<tag>`` lists and wait for ``gate:<tag>``; the test
waits on those events, never on sleeps. See tests/celery_app.py.
``REDLOCK_TEST_CELERY_POOL=prefork`` runs the same tests on the prefork pool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

celery = pytest.importorskip(
    "celery", minversion="5.3", reason="Celery is not installed (pip install 'django-redlock[celery]')"
)
import celery.exceptions  # noqa: E402

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

import celery.result  # noqa: E402
from django_redlock.celery import SKIPPED, RedlockTask, TaskAlreadyQueued, current_lock, redlock_task  # noqa: E402
from django_redlock.celery_send import HEADER  # noqa: E402
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable  # noqa: E402
from django_redlock.manager import get_lock_manager  # noqa: E402
from django_redlock.testing import RedisServer  # noqa: E402
from tests import celery_app as tasks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = 30  # seconds any single event may take on a busy machine before the test fails


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def broker():
    """A redis-server for Celery and the event channel, and the test process's app pointed at it."""
    server = RedisServer().start()
    env = {
        "REDLOCK_TEST_BROKER": f"redis://127.0.0.1:{server.port}/0",
        "REDLOCK_TEST_RESULTS": f"redis://127.0.0.1:{server.port}/1",
        "REDLOCK_TEST_EVENTS": f"redis://127.0.0.1:{server.port}/2",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        tasks.app.conf.update(broker_url=env["REDLOCK_TEST_BROKER"], result_backend=env["REDLOCK_TEST_RESULTS"])
        try:
            yield env
        finally:
            server.stop()


class Worker:
    def __init__(self, process: subprocess.Popen, log: str) -> None:
        self.process = process
        self.log = log

    def output(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()


@pytest.fixture(scope="module")
def worker(broker, redis_servers, tmp_path_factory):
    """One ``celery worker`` subprocess, ready once a task made the round trip; stopped with SIGTERM."""
    yield from run_worker(broker, redis_servers, str(tmp_path_factory.mktemp("celery") / "worker.log"), "celery")


def run_worker(broker, redis_servers, log, queue):
    """A ``celery worker`` subprocess consuming ``queue``, ready once a task made the round trip there."""
    env = dict(os.environ, **broker)
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", REDLOCK_TEST_NODES=",".join(redis_servers.urls))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-Q", queue,
        f"--pool={os.environ.get('REDLOCK_TEST_CELERY_POOL', 'threads')}", "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=INFO", "-n", f"redlock-tests-{queue}-{os.getpid()}@%h",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Worker(process, log)
    try:
        ping = tasks.ping.apply_async(queue=queue)  # ready once this round trip is done
        deadline = time.monotonic() + 60
        while True:
            try:
                assert ping.get(timeout=1) == "pong"
                break
            except celery.exceptions.TimeoutError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Celery worker did not answer; its log:\n{running.output()}") from None
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish first
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def lock_nodes(redlock_settings, servers):
    """The five lock nodes, healed and empty, with this process's settings pointing at them."""
    yield servers
    assert_nothing_locked()


# -- helpers ---------------------------------------------------------------------


def tag() -> str:
    return uuid.uuid4().hex[:12]


def next_event(name: str, timeout: float = WAIT) -> dict:
    item = tasks.events().blpop([f"ev:{name}"], timeout=timeout)
    assert item is not None, f"no event from task {name} within {timeout} s"
    return json.loads(item[1])


def expect(name: str, event: str, timeout: float = WAIT) -> dict:
    got = next_event(name, timeout)
    assert got["event"] == event, got
    return got


def open_gate(name: str) -> None:
    tasks.events().rpush(f"gate:{name}", 1)


def ran(name: str) -> bool:
    """True when the task body reported anything (it started)."""
    return tasks.events().llen(f"ev:{name}") > 0


def retries(task_id: str) -> list[dict]:
    return [json.loads(x) for x in tasks.events().lrange(f"retry:{task_id}", 0, -1)]


def next_retry(task_id: str, timeout: float = WAIT) -> dict:
    item = tasks.events().blpop([f"retry:{task_id}"], timeout=timeout)
    assert item is not None, f"task {task_id} was not retried within {timeout} s"
    return json.loads(item[1])


def failure(result, exc_type: type) -> BaseException:
    result.get(timeout=WAIT, propagate=False)
    assert result.state == "FAILURE", (result.state, result.result)
    assert isinstance(result.result, exc_type), repr(result.result)
    return result.result


def assert_nothing_locked() -> None:
    left = [record.resource for record in get_lock_manager().live_locks()]
    assert left == [], f"locks left behind: {left}"


# -- a real worker ---------------------------------------------------------------


def test_same_key_runs_one_at_a_time_the_second_is_skipped(worker, lock_nodes):
    first, second, third = tag(), tag(), tag()
    a = tasks.skip_job.delay("s", first, hold=True)
    start = expect(first, "start")
    assert start["resource"] == "job-s"
    assert start["label"] == f"celery tests.celery_app.skip_job[{a.id}]"  # what `redlock list` shows
    b = tasks.skip_job.delay("s", second)
    assert b.get(timeout=WAIT) == SKIPPED
    c = tasks.base_job.delay("s", third)  # base=RedlockTask, same key
    assert c.get(timeout=WAIT) == SKIPPED
    assert not ran(second) and not ran(third)  # their bodies never ran
    assert get_lock_manager().is_locked("job-s")
    open_gate(first)
    assert a.get(timeout=WAIT) == f"done {first}"
    expect(first, "end")
    # Free again: the next call runs.
    assert tasks.base_job.delay("s", third).get(timeout=WAIT) == f"done {third}"


def test_same_key_retry_runs_after_the_first_with_countdown_from_retry_after(worker, lock_nodes):
    first, second = tag(), tag()
    a = tasks.retry_job.delay("r", first, hold=True)
    expect(first, "start")
    b = tasks.retry_job.delay("r", second)
    retry = next_retry(b.id)
    # ttl=2 and the watchdog keeps it extended: Retry-After is at most 2 s, and at least 1.
    assert 1 <= retry["when"] <= 2, retry
    assert "LockNotAcquired" in retry["exc"] and "job-r" in retry["exc"]
    assert not ran(second)
    open_gate(first)
    assert a.get(timeout=WAIT) == f"done {first}"
    assert b.get(timeout=WAIT) == f"done {second}"
    start = expect(second, "start")
    assert start["retries"] >= 1
    assert start["at"] >= retry["at"] + retry["when"] - 0.5  # the countdown was honoured


def test_retry_countdown_chooses_when_a_locked_task_retries(worker, lock_nodes):
    name = tag()
    holder = get_lock_manager().acquire("job-c", ttl=10, blocking=False)  # its Retry-After: about 10 s
    try:
        result = tasks.quick_retry_job.delay("c", name)
        first, second = next_retry(result.id), next_retry(result.id)
        assert first["when"] == second["when"] == 0.2, (first, second)  # retry_countdown, not the Retry-After
        assert not ran(name)
    finally:
        holder.release()
    assert result.get(timeout=WAIT) == f"done {name}"
    assert expect(name, "start")["retries"] >= 2


def test_different_keys_run_concurrently(worker, lock_nodes):
    one, two = tag(), tag()
    a = tasks.skip_job.delay("k1", one, hold=True)
    b = tasks.skip_job.delay("k2", two, hold=True)
    expect(one, "start")
    expect(two, "start")  # both bodies are running: neither can end before its gate opens
    manager = get_lock_manager()
    assert manager.is_locked("job-k1") and manager.is_locked("job-k2")
    open_gate(one)
    open_gate(two)
    assert a.get(timeout=WAIT) == f"done {one}"
    assert b.get(timeout=WAIT) == f"done {two}"


def test_a_lock_lost_while_the_task_runs_fails_it_with_lock_lost(worker, lock_nodes):
    name = tag()
    a = tasks.skip_job.delay("lost", name, hold=True)
    expect(name, "start")
    manager = get_lock_manager()
    manager.force_release("job-lost")  # an operator's force release, then someone else takes it
    thief = manager.acquire("job-lost", ttl=10, blocking=False)
    try:
        noticed = expect(name, "noticed-lost")  # the watchdog marked it lost while the body ran
        assert noticed["reason"]
        expect(name, "end")
        error = failure(a, LockLost)  # the body returned normally; the task still failed
        assert "job-lost" in str(error) and "result is discarded" in str(error)
        assert thief.owned()  # the task's release did not touch the new holder's key
    finally:
        thief.release()


def test_nodes_down_fails_the_task_in_every_mode_never_a_skip(worker, lock_nodes):
    skipped, retried = tag(), tag()
    for server in lock_nodes[:3]:
        server.pause()
    try:
        s = tasks.skip_job.delay("down", skipped)
        r = tasks.retry_job.delay("down", retried)
        assert "nodes answered" in str(failure(s, QuorumUnavailable))
        failure(r, QuorumUnavailable)
    finally:
        for server in lock_nodes[:3]:
            server.resume()
    assert not ran(skipped) and not ran(retried)
    assert retries(r.id) == []  # an outage is not contention: no retry
    # Back to normal once the nodes answer again.
    assert tasks.skip_job.delay("down", skipped).get(timeout=WAIT) == f"done {skipped}"


def test_the_lock_is_released_when_the_task_raises_or_retries_itself_with_acks_late(worker, lock_nodes):
    boom, again = tag(), tag()
    failure(tasks.boom_job.delay("boom", boom), ValueError)
    expect(boom, "start")
    assert not get_lock_manager().is_locked("job-boom")
    # The body calls self.retry() while holding the lock (when_locked="fail"): the retry
    # finds the lock free only because it was released on the way out.
    result = tasks.self_retry_job.delay("again", again)
    assert result.get(timeout=WAIT) == f"done {again}"
    assert [expect(again, "start")["retries"], expect(again, "end")["event"]] == [0, "end"]
    assert [expect(again, "start")["retries"], expect(again, "end")["event"]] == [1, "end"]


def test_hand_off_a_lock_taken_in_the_request_to_the_task(worker, lock_nodes):
    name = tag()
    held = get_lock_manager().acquire("report-7", ttl=10, blocking=False)
    result = tasks.handoff_job.delay("report-7", held.token, name)
    assert result.get(timeout=WAIT) == f"done {name}"
    start = expect(name, "start")
    assert start["resource"] == "report-7" and 0 < start["validity"] <= 10
    assert not get_lock_manager().is_locked("report-7")  # the task released it


# -- lock_on_send: a duplicate is refused when it is sent ---------------------------------------------


def holder_label(resource: str) -> str | None:
    record = get_lock_manager().lock_record(resource)
    return record.holder.label if record is not None else None


def wait_until_free(resource: str, timeout: float) -> float:
    """Seconds until ``resource`` is free (polled: an expiry sends no event); fails after ``timeout``."""
    started = time.monotonic()
    while True:
        try:
            if not get_lock_manager().is_locked(resource):
                return time.monotonic() - started
        except QuorumUnavailable:
            pass  # nodes slow to answer on a busy machine: ask again
        assert time.monotonic() - started < timeout, f"{resource!r} still locked after {timeout} s"
        time.sleep(0.1)


def test_lock_on_send_refuses_a_duplicate_while_queued_and_while_running(worker, lock_nodes):
    first, second, third = tag(), tag(), tag()
    a = tasks.once_job.apply_async(("q", first), {"hold": True}, countdown=2)  # queued for two seconds
    assert holder_label("once-q") == f"celery tests.celery_app.once_job[{a.id}] (queued)"  # `redlock list`
    with pytest.raises(TaskAlreadyQueued) as queued:
        tasks.once_job.delay("q", second)
    assert not ran(first)  # refused while the first one was still in the queue
    assert isinstance(queued.value, LockNotAcquired) and queued.value.task_id == a.id
    assert a.id in str(queued.value) and "once-q" in str(queued.value)
    expect(first, "start")  # now running, kept alive by the worker
    assert holder_label("once-q") == f"celery tests.celery_app.once_job[{a.id}]"
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_job.delay("q", second)
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_job.apply_async(args=("q", second))
    assert tasks.once_job.delay("other", third).get(timeout=WAIT) == f"done {third}"  # another key is sent
    open_gate(first)
    assert a.get(timeout=WAIT) == f"done {first}"
    assert not ran(second)
    assert not get_lock_manager().is_locked("once-q")  # released when it finished
    assert tasks.once_job.delay("q", second).get(timeout=WAIT) == f"done {second}"


def test_lock_on_send_the_message_carries_no_secret(worker, lock_nodes):
    from celery.signals import before_task_publish

    name = tag()
    published = []

    def record(headers=None, body=None, **kwargs):
        published.append(repr((headers, body)))

    before_task_publish.connect(record)
    try:
        a = tasks.once_job.apply_async(("secret", name), {"hold": True}, countdown=1)
    finally:
        before_task_publish.disconnect(record)
    label = f"celery tests.celery_app.once_job[{a.id}] (queued)"
    assert HEADER in published[0] and label in published[0]  # the message names the lock by its label
    queued = get_lock_manager().lock_record("once-secret").holder  # still queued (countdown=1)
    assert queued.label == label
    expect(name, "start")
    running = get_lock_manager().lock_record("once-secret").holder
    assert running.label == f"celery tests.celery_app.once_job[{a.id}]"  # the worker's own lock
    assert running.token != queued.token
    with pytest.raises(TaskAlreadyQueued) as refused:
        tasks.once_job.delay("secret", name)
    shown = [published[0], str(refused.value), repr(refused.value)]
    open_gate(name)
    assert a.get(timeout=WAIT) == f"done {name}"
    shown.append(worker.output())
    for secret in (queued.token, running.token):
        assert len(secret) == 40 and not any(secret in text for text in shown)


def test_lock_on_send_returns_the_queued_tasks_result_with_when_duplicate_result(worker, lock_nodes):
    first, second = tag(), tag()
    a = tasks.once_result_job.delay("r", first, hold=True)
    b = tasks.once_result_job.delay("r", second)  # queued or running: either way, the same task
    assert b.id == a.id and isinstance(b, celery.result.AsyncResult)
    open_gate(first)
    assert b.get(timeout=WAIT) == f"done {first}"
    assert not ran(second)
    assert tasks.once_result_job.delay("r", second).get(timeout=WAIT) == f"done {second}"


def test_lock_on_send_a_failure_releases_a_retry_keeps_it(worker, lock_nodes):
    boom, again, other = tag(), tag(), tag()
    failure(tasks.once_job.delay("f", boom, fail=True), ValueError)
    assert not get_lock_manager().is_locked("once-f")
    a = tasks.once_job.delay("f", again, hold=True, retry_once=True)
    assert [expect(again, "start")["retries"], expect(again, "end")["event"]] == [0, "end"]
    next_retry(a.id)  # the retry is sent: queued for 0.5 s, then running (holding) on the worker
    with pytest.raises(TaskAlreadyQueued) as refused:
        tasks.once_job.delay("f", other)
    assert refused.value.task_id == a.id  # a retry keeps the task's id, and the lock
    assert expect(again, "start")["retries"] == 1
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_job.delay("f", other)
    open_gate(again)
    assert a.get(timeout=WAIT) == f"done {again}"
    assert not get_lock_manager().is_locked("once-f") and not ran(other)


def test_lock_on_send_a_second_delivery_of_the_message_cannot_take_it_over(worker, lock_nodes):
    first, second = tag(), tag()
    task_id = str(uuid.uuid4())
    label = f"celery tests.celery_app.once_job[{task_id}] (queued)"
    sent = get_lock_manager().acquire("once-twice", ttl=20, blocking=False, label=label)  # as apply_async does
    header = {HEADER: [["once-twice"], label]}
    tasks.once_job.apply_async(("twice", first), {"hold": True}, task_id=task_id, headers=header)
    expect(first, "start")
    assert not sent.owned()  # the worker released the lock the task was sent under, and took its own
    assert holder_label("once-twice") == f"celery tests.celery_app.once_job[{task_id}]"
    # The same message delivered again (same id, same header): it does not find the running one's
    # lock under the queued label, tries to take it, and is skipped.
    tasks.once_job.apply_async(("twice", second), task_id=task_id, headers=header)
    assert tasks.app.AsyncResult(task_id).get(timeout=WAIT) == SKIPPED and not ran(second)
    open_gate(first)
    expect(first, "end")
    wait_until_free("once-twice", WAIT)


def test_lock_on_send_autoretry_for_keeps_the_lock_until_it_gives_up(worker, lock_nodes):
    name, other = tag(), tag()
    a = tasks.once_autoretry_job.delay("ar", name)
    assert [expect(name, "start")["retries"], expect(name, "end")["event"]] == [0, "end"]
    next_retry(a.id)
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_autoretry_job.delay("ar", other)  # the retry is queued under the lock
    assert expect(name, "start")["retries"] == 1
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_autoretry_job.delay("ar", other)  # and runs under it
    open_gate(name)
    failure(a, ValueError)  # max_retries=1: it gave up
    wait_until_free("once-a-ar", WAIT)  # released after the task (the keep-alive would hold it forever)
    assert not ran(other)


def test_lock_on_send_a_revoked_task_releases_its_lock(worker, lock_nodes):
    name = tag()
    a = tasks.once_job.apply_async(("rev", name), countdown=1)
    sent = time.monotonic()
    a.revoke()
    wait_until_free("once-rev", WAIT)  # released by the worker when it drops the task, at its eta
    assert time.monotonic() - sent < 20 - 5  # released: the queued lock's 20 s ttl did not run out
    assert not ran(name)
    assert tasks.once_job.delay("rev", name).get(timeout=WAIT) == f"done {name}"


def test_lock_on_send_a_send_that_fails_releases_the_lock(worker, lock_nodes):
    from kombu import Connection

    from django_redlock.signals import lock_acquired, lock_released

    name = tag()
    events = []

    def record(signal, lock, **kwargs):
        events.append((signal, lock.resource))

    lock_acquired.connect(record)
    lock_released.connect(record)
    dead = RedisServer().start()
    dead.stop()  # a broker that refuses connections
    try:
        with Connection(f"redis://127.0.0.1:{dead.port}/0", connect_timeout=1) as down:
            with pytest.raises(Exception) as error:
                tasks.once_job.apply_async(("down", name), connection=down, retry=False)
    finally:
        lock_acquired.disconnect(record)
        lock_released.disconnect(record)
    assert not isinstance(error.value, LockNotAcquired), error.value
    assert events == [(lock_acquired, "once-down"), (lock_released, "once-down")]  # taken, then released
    assert not get_lock_manager().is_locked("once-down")
    assert tasks.once_job.delay("down", name).get(timeout=WAIT) == f"done {name}"


def test_lock_on_send_a_worker_killed_mid_task_leaves_a_lock_that_expires(
    worker, broker, redis_servers, lock_nodes, tmp_path
):
    name, after = tag(), tag()
    doomed = run_worker(broker, redis_servers, str(tmp_path / "doomed.log"), "doomed")
    running = next(doomed)
    try:
        tasks.once_job.apply_async(("kill", name), {"hold": True}, queue="doomed")
        expect(name, "start")
        running.process.kill()  # SIGKILL mid-task: no release; the keep-alive dies with it
        running.process.wait()
        killed = time.monotonic()
        with pytest.raises(TaskAlreadyQueued) as refused:
            tasks.once_job.delay("kill", after)
        assert refused.value.retry_after <= 5  # the worker's lock (ttl 5 s), not the one sent (queued_ttl 20 s)
        wait_until_free("once-kill", WAIT)
        assert time.monotonic() - killed < 20 - 5  # it expired by the task's ttl
    finally:
        doomed.close()
    assert tasks.once_job.delay("kill", after).get(timeout=WAIT) == f"done {after}"  # accepted once it expired



def test_lock_on_send_the_worker_keeps_it_alive_past_the_queued_ttl(worker, lock_nodes):
    name, other = tag(), tag()
    a = tasks.once_short_job.delay("alive", name, hold=True)
    expect(name, "start")
    label = holder_label("once-s-alive")
    time.sleep(3)  # three times the queued_ttl and the ttl (1 s each): only the worker's keep-alive holds it
    assert holder_label("once-s-alive") == label == f"celery tests.celery_app.once_short_job[{a.id}]"
    with pytest.raises(TaskAlreadyQueued):
        tasks.once_short_job.delay("alive", other)
    open_gate(name)
    assert a.get(timeout=WAIT) == f"done {name}"
    assert expect(name, "end")["event"] == "end"  # never noticed a loss


def test_lock_on_send_a_queue_wait_longer_than_queued_ttl(worker, lock_nodes):
    late, second = tag(), tag()
    a = tasks.once_short_job.apply_async(("late", late), countdown=3)
    wait_until_free("once-s-late", WAIT)  # its queued_ttl (1 s) ran out while it waited
    b = tasks.once_short_job.delay("late", second, hold=True)  # so a second one is sent
    expect(second, "start")
    # The first one finds its lock gone, tries to take it as any task would, and meets the second:
    # when_locked="skip".
    assert a.get(timeout=WAIT) == SKIPPED and not ran(late)
    open_gate(second)
    assert b.get(timeout=WAIT) == f"done {second}"

# -- eagerly, in this process ------------------------------------------------------


def test_eager_every_mode_against_another_holder(lock_nodes, manager):
    other = manager.acquire("job-e", ttl=10, blocking=False)  # another client of the nodes
    name = tag()
    assert tasks.skip_job.apply(("e", name)).get() == SKIPPED
    result = tasks.retry_job.apply(("e", name))
    assert isinstance(result.result, LockNotAcquired) and result.state == "FAILURE"
    assert len(retries(result.id)) == 10  # max_retries=10, then the contention is the failure
    assert all(1 <= r["when"] <= 10 for r in retries(result.id))
    assert isinstance(tasks.fail_job.apply(("e", name)).result, LockNotAcquired)
    started = time.monotonic()
    result = tasks.wait_job.apply(("e", name))
    assert isinstance(result.result, LockNotAcquired)
    assert 0.2 < time.monotonic() - started < 5  # waited its wait_timeout (0.3 s) in line
    assert not ran(name)
    other.release()
    for task in (tasks.skip_job, tasks.retry_job, tasks.fail_job, tasks.wait_job, tasks.base_job):
        assert task.apply(("e", name)).get() == f"done {name}"


def test_eager_task_always_eager_and_direct_calls(lock_nodes, manager):
    name = tag()
    tasks.app.conf.task_always_eager = True
    try:
        assert tasks.retry_job.delay("d", name).get() == f"done {name}"
        other = manager.acquire("job-d", ttl=10, blocking=False)
        assert tasks.skip_job.delay("d", name).get() == SKIPPED
        assert tasks.skip_job("d", name) == SKIPPED  # called directly, as a function
        with pytest.raises(LockNotAcquired):
            tasks.retry_job("d", name)  # called directly: no retry to schedule, the error itself
        with pytest.raises(LockNotAcquired):
            tasks.retry_job.run("d", name)  # the body alone, outside any task
        other.release()
        assert tasks.skip_job("d", name) == f"done {name}"
    finally:
        tasks.app.conf.task_always_eager = False
    assert current_lock() is None


def test_eager_lock_on_send(lock_nodes, manager):
    name = tag()
    tasks.app.conf.task_always_eager = True
    try:
        assert tasks.once_job.delay("e", name).get() == f"done {name}"  # taken when sent, adopted, released
        assert not manager.is_locked("once-e")
        assert tasks.once_job.delay("e", name, retry_once=True).get() == f"done {name}"
        reported = map(json.loads, tasks.events().lrange(f"ev:{name}", 0, -1))
        assert [e["retries"] for e in reported if e["event"] == "start"] == [0, 0, 1]
        assert not manager.is_locked("once-e")
        other = manager.acquire(["once-e", "once-r-e"], ttl=10, blocking=False)  # not a task: no task id
        with pytest.raises(TaskAlreadyQueued) as refused:
            tasks.once_job.delay("e", name)
        assert refused.value.task_id is None and "another holder" in str(refused.value)
        with pytest.raises(TaskAlreadyQueued):
            tasks.once_result_job.delay("e", name)  # the same with when_duplicate="result": no task to return
        assert tasks.once_job.apply(("e", name)).get() == SKIPPED  # apply() sends nothing: when_locked
        other.release()
    finally:
        tasks.app.conf.task_always_eager = False


def test_lock_on_send_needs_redlock_task_and_a_queued_ttl_within_max_ttl(lock_nodes, settings):
    def body(name):
        return name

    plain = tasks.app.task(shared=False, lazy=False, name=f"plain.{tag()}")(redlock_task("p-{name}", lock_on_send=True)(body))
    error = plain.apply(("x",)).result
    assert isinstance(error, ImproperlyConfigured) and "base=RedlockTask" in str(error)
    settings.REDLOCK = {**settings.REDLOCK, "MAX_TTL": 5, "TTL": 2}
    long = tasks.app.task(base=RedlockTask, shared=False, lazy=False, name=f"long.{tag()}")(
        redlock_task("l-{name}", lock_on_send=True, queued_ttl=30)(body)
    )
    with pytest.raises(ValueError, match=r"queued_ttl \(30 s\) is above REDLOCK\['MAX_TTL'\] \(5 s\)"):
        long.delay("x")
    assert not get_lock_manager().is_locked("l-x")


def test_eager_several_keys_together(lock_nodes, manager):
    name = tag()
    assert tasks.transfer_job.apply((1, 2, name)).get() == f"done {name}"
    assert expect(name, "start")["resource"] == "account-1, account-2"
    other = manager.acquire("account-2", ttl=10, blocking=False)
    assert tasks.transfer_job.apply((3, 2, name)).get() == SKIPPED
    other.release()


def test_eager_lost_at_release_and_nodes_down(lock_nodes):
    name = tag()
    error = tasks.stolen_job.apply(("stolen", name)).result
    assert isinstance(error, LockLost) and "job-stolen" in str(error)
    for server in lock_nodes[:3]:
        server.pause()
    try:
        for task in (tasks.skip_job, tasks.retry_job, tasks.fail_job, tasks.base_job):
            assert isinstance(task.apply(("down", name)).result, QuorumUnavailable), task.name
    finally:
        for server in lock_nodes[:3]:
            server.resume()


def test_eager_autoretry_for_quorum_unavailable_and_retry_on_contention(lock_nodes, manager):
    name = tag()
    other = manager.acquire("job-o", ttl=10, blocking=False)
    result = tasks.outage_job.apply(("o", name))
    assert isinstance(result.result, LockNotAcquired) and not isinstance(result.result, QuorumUnavailable)
    # Contention: retried with the holder's Retry-After (about 10 s), not autoretry's countdown.
    assert [r["when"] >= 9 for r in retries(result.id)] == [True, True]
    other.release()
    for server in lock_nodes[:3]:
        server.pause()
    try:
        result = tasks.outage_job.apply(("o", name))
        assert isinstance(result.result, QuorumUnavailable)
        assert [r["when"] for r in retries(result.id)] == [1, 1]  # autoretry_for, then the outage fails it
    finally:
        for server in lock_nodes[:3]:
            server.resume()
    assert not ran(name)


def test_retry_from_the_body_releases_first(lock_nodes):
    name = tag()
    result = tasks.self_retry_job.apply(("self", name))
    assert result.get() == f"done {name}"
    assert [expect(name, "start")["retries"], expect(name, "end")["event"]] == [0, "end"]
    assert expect(name, "start")["retries"] == 1


# -- mistakes are reported early -------------------------------------------------


def test_configuration_errors_are_reported_at_decoration():
    def body(self, customer_id):
        return customer_id

    with pytest.raises(ImproperlyConfigured, match=r"uses 'customer', which .*body\(\) does not take"):
        redlock_task("report-{customer}")(body)
    with pytest.raises(ImproperlyConfigured, match="when_locked must be one of"):
        redlock_task("report-{customer_id}", when_locked="queue")  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="needs wait_timeout"):
        redlock_task("report-{customer_id}", when_locked="wait")
    with pytest.raises(ImproperlyConfigured, match="only used with when_locked='wait'"):
        redlock_task("report-{customer_id}", when_locked="skip", wait_timeout=3)
    with pytest.raises(ValueError):
        redlock_task("report-{customer_id}", ttl=-1)
    with pytest.raises(ImproperlyConfigured, match="below @app.task"):
        redlock_task("job-{name}")(tasks.skip_job)

    async def coroutine(customer_id):
        return customer_id

    with pytest.raises(ImproperlyConfigured, match="async def"):
        redlock_task("report-{customer_id}")(coroutine)
    with pytest.raises(ImproperlyConfigured, match="use named placeholders"):
        redlock_task("report-{0}")(body)
    with pytest.raises(ImproperlyConfigured, match="retry_countdown=1 is only used with when_locked='retry'"):
        redlock_task("report-{customer_id}", when_locked="skip", retry_countdown=1)
    with pytest.raises(ValueError, match="retry_countdown"):
        redlock_task("report-{customer_id}", retry_countdown=-1)
    with pytest.raises(ImproperlyConfigured, match="only used with lock_on_send=True"):
        redlock_task("report-{customer_id}", queued_ttl=60)
    with pytest.raises(ImproperlyConfigured, match="only used with lock_on_send=True"):
        redlock_task("report-{customer_id}", when_duplicate="result")
    with pytest.raises(ImproperlyConfigured, match="when_duplicate must be one of 'raise', 'result'"):
        redlock_task("report-{customer_id}", lock_on_send=True, when_duplicate="ignore")  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="lock_on_send must be True or False"):
        redlock_task("report-{customer_id}", lock_on_send="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queued_ttl"):
        redlock_task("report-{customer_id}", lock_on_send=True, queued_ttl=0)


def test_base_class_errors_are_reported_when_the_task_is_created():
    def body(customer_id):
        return customer_id

    def create(**options):
        return tasks.app.task(base=RedlockTask, shared=False, lazy=False, name=f"bad.{tag()}", **options)(body)

    with pytest.raises(ImproperlyConfigured, match="sets no redlock"):
        create()
    with pytest.raises(ImproperlyConfigured, match="at least 'key'"):
        create(redlock={"ttl": 5})
    with pytest.raises(ImproperlyConfigured, match="unknown redlock option.*'blocking'"):
        create(redlock={"key": "r-{customer_id}", "blocking": True})
    with pytest.raises(ImproperlyConfigured, match="does not take"):
        create(redlock={"key": "r-{customer}"})
    with pytest.raises(ImproperlyConfigured, match="only used with lock_on_send=True"):
        create(redlock={"key": "r-{customer_id}", "queued_ttl": 5})


def test_class_based_tasks_lock_their_own_key(lock_nodes):
    class Report(RedlockTask):
        name = f"good.{tag()}"
        redlock = {"key": "report-{customer_id}", "when_locked": "skip"}

        def run(self, customer_id):
            return current_lock().resource

    class Weekly(Report):
        name = f"good.{tag()}"
        redlock = {"key": "weekly-{customer_id}", "when_locked": "skip"}

    assert Report.run.__wrapped__ is Weekly.run.__wrapped__  # one body, each class its own options
    report, weekly = tasks.app.register_task(Report()), tasks.app.register_task(Weekly())
    assert report.apply((5,)).get() == "report-5"
    assert weekly.apply((5,)).get() == "weekly-5"


def test_arguments_are_checked_against_the_task_signature_when_sent():
    with pytest.raises(TypeError):
        tasks.skip_job.apply_async(args=("only-a-name",))  # `tag` is missing: refused before sending
    with pytest.raises(TypeError):
        tasks.base_job.apply_async(kwargs={"name": "x", "tag": "y", "colour": "red"})


def test_the_package_imports_without_celery():
    code = (
        "import sys; sys.modules['celery'] = None\n"
        "import django; django.setup()\n"
        "import django_redlock, django_redlock.decorators, django_redlock.manager, django_redlock.admin\n"
        "try:\n"
        "    import django_redlock.celery\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'django-redlock[celery]'" in out.stdout
