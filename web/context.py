from django.conf import settings
from django.utils.functional import SimpleLazyObject

from web.pages import member_of


def member(request):
    """`member`: the signed-in active member or None; `inbox_pending`: their
    pending inbox items, counted only if a template shows it;
    `live_heartbeat_seconds`: how often the live sockets speak."""
    from inbox.delivery import pending_count

    current = member_of(getattr(request, "user", None))
    return {"member": current, "live_heartbeat_seconds": settings.LIVE_HEARTBEAT_SECONDS,
            "inbox_pending": SimpleLazyObject(lambda: pending_count(current) if current else 0)}
