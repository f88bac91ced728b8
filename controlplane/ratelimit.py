"""Fixed-window rate limits in the cache (local memory in the embedded
deployment, Redis when REDIS_URL is set): the one counter every limit uses,
the API's per-member limit, credential creation and the web app's sign-in
and actions alike."""
from __future__ import annotations

from django.conf import settings
from django.core.cache import cache

from controlplane.clock import timestamp


def client_address(request) -> str:
    """The client's address: the peer's, or with TRUST_PROXY_HEADERS the
    last address the proxy appended to X-Forwarded-For (the ones before it
    come from the client and prove nothing)."""
    if settings.TRUST_PROXY_HEADERS:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()]
        if forwarded:
            return forwarded[-1]
    return request.META.get("REMOTE_ADDR", "")


def hit(key: str, *, limit: int, window: int) -> float | None:
    """Count one hit on `key` in the current window of `window` seconds.
    None while within `limit` (0 or less: no limit); otherwise the seconds
    until the window ends (the Retry-After)."""
    if limit <= 0:
        return None
    now = timestamp()
    slot = f"rl:{key}:{window}:{int(now // window)}"
    if cache.add(slot, 1, window * 2):
        count = 1
    else:
        try:
            count = cache.incr(slot)
        except ValueError:  # expired between add and incr
            cache.add(slot, 1, window * 2)
            count = 1
    return None if count <= limit else window - (now % window)
