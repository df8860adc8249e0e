"""A long job that must run on one host at a time (used by the command-decorator tests)."""

import time
from pathlib import Path

from django.core.management.base import BaseCommand

from django_redlock import redlock_command


@redlock_command(ttl=0.5)
class Command(BaseCommand):
    help = "Pretend to do nightly work for --seconds, writing progress to --marker."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=0.0)
        parser.add_argument("--marker", default=None)

    def handle(self, *args, **options):
        marker = Path(options["marker"]) if options["marker"] else None
        if marker:
            marker.write_text("started\n")
        deadline = time.monotonic() + options["seconds"]
        while time.monotonic() < deadline:
            time.sleep(0.02)  # the "work"
        if marker:
            marker.write_text("started\ndone\n")
        self.stdout.write("nightly done")
