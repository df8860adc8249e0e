"""The Celery app and tasks of tests/test_celery.py; a real worker runs them in a subprocess.

The worker and the test process meet on a Redis server of their own (not a
lock node): the broker (db 0), the result backend (db 1), and ``ev:<tag>``
lists (db 2) where each task body reports what it does. A body started with
``hold=True`` then waits for ``gate:<tag>``, or stops early when it sees its
lock lost. URLs come from the environment, set by the test fixtures.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import redis  # noqa: E402
from celery import Celery, current_task  # noqa: E402
from celery.signals import task_retry  # noqa: E402

from django_redlock.celery import RedlockTask, current_lock, redlock_task  # noqa: E402
from django_redlock.exceptions import QuorumUnavailable  # noqa: E402
from django_redlock.manager import get_lock_manager  # noqa: E402

app = Celery("tests")
app.conf.update(
    broker_url=os.environ.get("REDLOCK_TEST_BROKER", "memory://"),
    result_backend=os.environ.get("REDLOCK_TEST_RESULTS", "cache+memory://"),
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_track_started=True,
    result_expires=600,
)

_events: dict[str, redis.Redis] = {}


def events() -> redis.Redis:
    url = os.environ["REDLOCK_TEST_EVENTS"]
    client = _events.get(url)
    if client is None:
        client = _events[url] = redis.Redis.from_url(url, socket_timeout=120)  # BLPOP waits longer than the default 5 s
    return client


def report(tag: str, event: str, **data: Any) -> None:
    events().rpush(f"ev:{tag}", json.dumps({"event": event, "at": time.time(), **data}))


def work(tag: str, hold: bool) -> str:
    """A task body: report the start (with the lock it holds), optionally wait for the gate."""
    lock = current_lock()
    task = current_task._get_current_object()
    report(
        tag,
        "start",
        retries=task.request.retries if task is not None else None,
        resource=lock.resource if lock is not None else None,
        label=lock.holder.label if lock is not None else None,
    )
    if hold:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if lock is not None and lock.lost:
                report(tag, "noticed-lost", reason=lock.lost_reason)
                break
            if events().blpop([f"gate:{tag}"], timeout=0.1):
                break
    report(tag, "end")
    return f"done {tag}"


@task_retry.connect
def record_retry(request: Any = None, reason: Any = None, **kwargs: Any) -> None:
    """Every retry, worker or eager, lands in ``retry:<task id>`` with its countdown."""
    if os.environ.get("REDLOCK_TEST_EVENTS") and request is not None:
        entry = {"when": reason.when, "exc": repr(reason.exc), "at": time.time()}
        events().rpush(f"retry:{request.id}", json.dumps(entry))


@app.task
def ping() -> str:
    return "pong"


@app.task(bind=True)
@redlock_task("job-{name}", ttl=2, when_locked="skip")
def skip_job(self: Any, name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task(bind=True, max_retries=10)
@redlock_task("job-{name}", ttl=2, when_locked="retry")
def retry_job(self: Any, name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task
@redlock_task("job-{name}", ttl=2, when_locked="fail")
def fail_job(name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task
@redlock_task("job-{name}", ttl=2, when_locked="wait", wait_timeout=0.3)
def wait_job(name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task(base=RedlockTask, redlock={"key": "job-{name}", "ttl": 2, "when_locked": "skip"})
def base_job(name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task(bind=True)
@redlock_task(["account-{src}", "account-{dst}"], ttl=2, when_locked="skip")
def transfer_job(self: Any, src: int, dst: int, tag: str) -> str:
    return work(tag, False)


@app.task(bind=True, max_retries=2, autoretry_for=(QuorumUnavailable,), retry_kwargs={"countdown": 1})
@redlock_task("job-{name}", ttl=2, when_locked="retry")
def outage_job(self: Any, name: str, tag: str) -> str:
    """Retries on contention (countdown = Retry-After) and, through autoretry_for, on an outage."""
    return work(tag, False)


@app.task(bind=True, acks_late=True)
@redlock_task("job-{name}", ttl=2, when_locked="fail")
def boom_job(self: Any, name: str, tag: str) -> str:
    work(tag, False)
    raise ValueError(f"boom {tag}")


@app.task(bind=True, acks_late=True, max_retries=3)
@redlock_task("job-{name}", ttl=2, when_locked="fail")
def self_retry_job(self: Any, name: str, tag: str) -> str:
    """Retries itself once while holding the lock: the retry finds the lock free only if it was released.

    The retry is sent from inside the body, before the release: it is due 0.5 s later (well inside the
    lock's 2 s ttl), so that a busy worker's other thread cannot take it up before the release ran."""
    work(tag, False)
    if self.request.retries == 0:
        raise self.retry(countdown=0.5)
    return f"done {tag}"


@app.task
@redlock_task("job-{name}", ttl=2, when_locked="fail")
def stolen_job(name: str, tag: str) -> str:
    """Its lock is force-released under it before it returns."""
    work(tag, False)
    get_lock_manager().force_release(current_lock().resource)  # type: ignore[union-attr]
    return f"done {tag}"


@app.task
def handoff_job(resource: str, token: str, tag: str) -> str:
    """The hand-off pattern: a lock taken elsewhere, adopted here and released when done."""
    lock = get_lock_manager().adopt(resource, token)
    try:
        report(tag, "start", resource=lock.resource, validity=lock.validity)
    finally:
        lock.release()
    return f"done {tag}"


# -- lock_on_send: the lock is taken when the task is sent ---------------------------------------------


@app.task(base=RedlockTask, bind=True, max_retries=3)
@redlock_task("once-{name}", ttl=5, lock_on_send=True, queued_ttl=20, when_locked="skip")
def once_job(self: Any, name: str, tag: str, hold: bool = False, retry_once: bool = False, fail: bool = False) -> str:
    """Sent under its lock. ``retry_once`` retries the first run (0.5 s later), holding on the second only."""
    if retry_once and self.request.retries == 0:
        work(tag, False)
        raise self.retry(countdown=0.5)
    out = work(tag, hold)
    if fail:
        raise ValueError(f"boom {tag}")
    return out


@app.task(base=RedlockTask, redlock={"key": "once-r-{name}", "ttl": 2, "lock_on_send": True, "when_duplicate": "result"})
def once_result_job(name: str, tag: str, hold: bool = False) -> str:
    return work(tag, hold)


@app.task(bind=True, max_retries=20)
@redlock_task("job-{name}", ttl=10, when_locked="retry", retry_countdown=0.2)
def quick_retry_job(self: Any, name: str, tag: str) -> str:
    """Retries every 0.2 s while the lock (ttl 10 s) is held elsewhere, not after its Retry-After."""
    return work(tag, False)


@app.task(base=RedlockTask, redlock={"key": "once-s-{name}", "ttl": 1, "lock_on_send": True, "queued_ttl": 1, "when_locked": "skip"})
def once_short_job(name: str, tag: str, hold: bool = False) -> str:
    """A lock that lives 1 s while queued and 1 s at a time while the body runs (kept alive)."""
    return work(tag, hold)


@app.task(base=RedlockTask, bind=True, autoretry_for=(ValueError,), max_retries=1, retry_kwargs={"countdown": 0.5})
@redlock_task("once-a-{name}", ttl=5, lock_on_send=True, queued_ttl=20, when_locked="skip")
def once_autoretry_job(self: Any, name: str, tag: str) -> str:
    """Fails every run: autoretry_for retries it once (holding on the retry), then it fails."""
    work(tag, self.request.retries > 0)
    raise ValueError(f"boom {tag}")
