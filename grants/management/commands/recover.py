"""Finish persisted revocation barriers before deliveries resume."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from grants import barrier


class Command(BaseCommand):
    help = ("Finish every revocation barrier a stopped process left in `revoking`, then expire due grants. "
            "Workers run this when they start; run it by hand after a crash if you like.")

    def handle(self, *args, **options):
        finished = barrier.recover()
        expired = barrier.expire_due()
        self.stdout.write(f"Finished {finished} interrupted barrier(s); expired {expired} grant(s).")
