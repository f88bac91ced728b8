"""Removing deleted webhook rows a day after the deletion (the hourly
`reap-deleted-webhooks` schedule, webhooks.tasks.reap_deleted): an endpoint
with its subscriptions, deliveries and attempts. Until then a worker may
still be recording an attempt of one of their deliveries, and the owner's
delivery history keeps them."""
from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.db.models import Exists, OuterRef

from controlplane.clock import now
from controlplane.models import Member
from webhooks.models import Delivery, Endpoint

# Far longer than a request in flight could take to be recorded.
DELETED_KEPT = dt.timedelta(days=1)


def remove_endpoints(owner_id: int, endpoints) -> int:
    """Delete `endpoints` (a queryset of `owner_id`'s, read under the lock)
    with their subscriptions, deliveries and attempts, in a transaction of
    its own under the owner's lock, as endpoints and subscriptions are
    created and deleted; but not one with a delivery still `sending` within
    its lease, whose worker may yet record its attempt. Returns how many."""
    with transaction.atomic():
        Member.take_turns(owner_id)
        in_flight = Delivery.objects.filter(subscription__endpoint=OuterRef("pk"), state=Delivery.State.SENDING,
                                            claimed_until__gte=now())
        removable = list(endpoints.exclude(Exists(in_flight)).values_list("pk", flat=True))
        Endpoint.objects.filter(pk__in=removable).delete()
    return len(removable)


def reap_deleted_endpoints(limit: int = 1000) -> int:
    """Remove the endpoints deleted more than DELETED_KEPT ago
    (webhooks.services.delete_endpoint), at most `limit` a run. Returns how
    many."""
    candidates = list(Endpoint.objects.filter(deleted_at__lt=now() - DELETED_KEPT)
                      .values_list("pk", "owner_id")[:limit])
    return sum(remove_endpoints(owner_id, Endpoint.objects.filter(pk=pk)) for pk, owner_id in candidates)
