"""The webhooks' backlog figures for `manage.py health` (controlplane.health)."""
from __future__ import annotations

from controlplane.clock import now
from controlplane.health import figures
from webhooks.due import due_now
from webhooks.engine import ready_params
from webhooks.models import Delivery, Subscription


@figures("wakes_due", "oldest_due_wake_seconds", "wakes_sending_past_lease", "subscriptions_suspended")
def gauges() -> dict[str, int | float | None]:
    """- wakes_due: wakes a worker could send now (due, their subscription
      may send, no older wake of it unfinished), and how long the oldest
      of them has been due (0: none is);
    - wakes_sending_past_lease: claims whose worker stopped before it
      recorded the attempt (the next claim takes them again);
    - subscriptions_suspended."""
    at = now()
    due, oldest = due_now(ready_params(at))
    return {
        "wakes_due": due,
        "oldest_due_wake_seconds": round((at - oldest).total_seconds(), 1) if oldest is not None else 0.0,
        "wakes_sending_past_lease": Delivery.objects.filter(state=Delivery.State.SENDING, claimed_until__lt=at).count(),
        "subscriptions_suspended": Subscription.objects.filter(status=Subscription.Status.SUSPENDED).count(),
    }
