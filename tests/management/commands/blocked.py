"""A command that waits in one blocking call (used by the lost-lock interruption tests)."""

import socket
import threading
import time
from pathlib import Path

from django.core.management.base import BaseCommand
from django.db import connection

from django_redlock import get_lock_manager, redlock_command


@redlock_command(ttl=1)
class Command(BaseCommand):
    help = (
        "Block for --seconds in time.sleep, a socket read, a lock wait, a wait in line for the redlock 'other' "
        "or an SQL statement (PostgreSQL's pg_sleep); write progress to --marker."
    )

    def add_arguments(self, parser):
        parser.add_argument("--block", choices=["sleep", "socket", "lock", "redlock", "sql"], default="sleep")
        parser.add_argument("--seconds", type=float, default=20.0)
        parser.add_argument("--marker", required=True)

    def handle(self, *args, **options):
        marker = Path(options["marker"])
        seconds = options["seconds"]
        marker.write_text("blocking\n")
        if options["block"] == "sleep":
            time.sleep(seconds)
        elif options["block"] == "socket":
            reader, writer = socket.socketpair()  # nothing is ever written
            reader.settimeout(seconds)
            try:
                reader.recv(1)
            except TimeoutError:
                pass
        elif options["block"] == "lock":
            held = threading.Lock()
            held.acquire()
            held.acquire(timeout=seconds)  # nobody releases it
        elif options["block"] == "redlock":
            with get_lock_manager().lock("other", timeout=seconds):  # held elsewhere
                pass
        else:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(%s)", [seconds])
        marker.write_text("blocking\ndone\n")
        self.stdout.write("blocked done")
