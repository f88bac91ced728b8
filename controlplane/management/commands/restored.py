from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane.models import LogHead

# How far positions jump after a restore: past every position the lost
# part of the log can have given out.
GAP = 2**40


class Command(BaseCommand):
    help = ("Run once after restoring the database from a backup, before serving: new events take positions past "
            "every one given out before, and readers whose cursors are past the restored log are told to "
            "resynchronize (410 RESYNC_REQUIRED), since they read events the restore lost (docs/deploy.md).")

    def handle(self, *args, **options):
        with transaction.atomic():
            head, _ = LogHead.objects.select_for_update().get_or_create(id=1)
            restored, jumped = head.position, head.position + GAP
            LogHead.objects.filter(id=1).update(lost_from=restored, lost_to=jumped, position=jumped)
        self.stdout.write(f"The restored log ends at position {restored}; new events start after {jumped}.")
