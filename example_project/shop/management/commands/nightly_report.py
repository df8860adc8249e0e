"""A long job that must run on one host at a time: run it in two terminals."""

import time

from django.core.management.base import BaseCommand

from django_redlock import redlock_command


@redlock_command(ttl=10)
class Command(BaseCommand):
    help = "Build the nightly report (pretend work for --seconds), on one host at a time."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=60.0)

    def handle(self, *args, **options):
        seconds = options["seconds"]
        self.stdout.write(f"Working for {seconds:.0f} s; the 10 s lock is extended while this runs.")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(5.0, left))  # never past the deadline: --seconds N runs N seconds
            self.stdout.write(f"  … {seconds - max(0.0, deadline - time.monotonic()):.0f} s")
        self.stdout.write(self.style.SUCCESS("Nightly report done."))
