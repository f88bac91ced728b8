from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane.models import LogHead

# How far positions jump after a restore: past every position the lost
# part of the log can have given out.
GAP = 2**40


class Command(BaseCommand):
    help = ("Run after restoring the database from a backup, before serving (running it again is harmless): new "
            "events take positions past "
            "every one given out before, and readers whose cursors are past the restored log are told to "
            "resynchronize (410 RESYNC_REQUIRED), since they read events the restore lost (docs/deploy.md).")

    def handle(self, *args, **options):
        with transaction.atomic():
            head, _ = LogHead.objects.select_for_update().get_or_create(id=1)
            restored, jumped = head.position, head.position + GAP
            # Nothing written since the last mark (a second run, or a backup taken right after
            # one): the lost range grows from where that one began, never forgetting it.
            lost_from = head.lost_from if head.lost_to and restored == head.lost_to else restored
            LogHead.objects.filter(id=1).update(lost_from=lost_from, lost_to=jumped, position=jumped)
        self.stdout.write(f"The restored log ends at position {restored}; new events start after {jumped}.")
