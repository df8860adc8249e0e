"""A command that talks to the lock nodes non-stop (used by the signal tests).

Its main thread spends much of its time inside the nodes' internal mutex, so a
signal handler that touched the nodes itself would deadlock.
"""

from pathlib import Path

from django.core.management.base import BaseCommand

from django_redlock import get_lock_manager, redlock_command


@redlock_command(ttl=5)
class Command(BaseCommand):
    help = "Call is_locked() and ping() in a tight loop until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--marker", required=True)

    def handle(self, *args, **options):
        manager = get_lock_manager()
        Path(options["marker"]).write_text("started\n")
        while True:
            manager.is_locked("busy-probe")
            manager.ping()
