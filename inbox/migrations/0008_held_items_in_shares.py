"""Held items now stay counted in their sender's share (inbox.mailbox):
count the ones held before, which left it when they were held."""
from django.db import migrations
from django.db.models import F, Sum


def _held(apps):
    InboxItem = apps.get_model("inbox", "InboxItem")
    return (InboxItem.objects.filter(state="pending", admission="held", sender__isnull=False)
            .values("member_id", "sender_id").annotate(n=Sum("content_bytes")).order_by())


def count_held(apps, schema_editor):
    MailboxShare = apps.get_model("inbox", "MailboxShare")
    for row in _held(apps).iterator():
        MailboxShare.objects.get_or_create(member_id=row["member_id"], sender_id=row["sender_id"])
        MailboxShare.objects.filter(member_id=row["member_id"], sender_id=row["sender_id"]).update(
            pending_bytes=F("pending_bytes") + row["n"])


def uncount_held(apps, schema_editor):
    MailboxShare = apps.get_model("inbox", "MailboxShare")
    for row in _held(apps).iterator():
        MailboxShare.objects.filter(member_id=row["member_id"], sender_id=row["sender_id"]).update(
            pending_bytes=F("pending_bytes") - row["n"])


class Migration(migrations.Migration):

    dependencies = [
        ("inbox", "0007_indexes_covered_by_composites"),
    ]

    operations = [
        migrations.RunPython(count_held, uncount_held),
    ]
