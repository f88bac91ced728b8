"""The inbox's backlog figures for `manage.py health` (controlplane.health)."""
from __future__ import annotations

from django.db.models import Count, Q

from controlplane.health import figures
from inbox.models import InboxItem


@figures("inbox_items_pending", "inbox_items_unclassified")
def gauges() -> dict[str, int]:
    """Pending items: admitted ones wait for their recipient to acknowledge
    them; unclassified ones wait for the firewall's classification task."""
    pending = InboxItem.objects.filter(state=InboxItem.State.PENDING).aggregate(
        admitted=Count("pk", filter=Q(admission=InboxItem.Admission.ADMITTED)),
        unclassified=Count("pk", filter=Q(admission=InboxItem.Admission.UNCLASSIFIED)))
    return {"inbox_items_pending": pending["admitted"], "inbox_items_unclassified": pending["unclassified"]}
