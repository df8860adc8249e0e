"""The pytest fixtures the package ships for projects' own test suites."""

from __future__ import annotations

from django_redlock import get_lock_manager


def test_the_plugin_is_registered_by_the_package(request):
    assert request.config.pluginmanager.hasplugin("django_redlock")


def test_its_nodes_vote_at_once_with_the_default_restart_rule(redlock_nodes, settings):
    settings.REDLOCK = {}  # the delayed-restart rule as in production
    manager = get_lock_manager()
    assert manager.config.restart_window > 0
    assert all(status.votes for status in manager.node_status())
    with manager.lock("first-run", blocking=False) as lock:
        assert lock.locked()
