"""Per-credential rate limiting: a fixed one-minute window in the cache
(local memory in the embedded deployment, Redis when REDIS_URL is set)."""
from __future__ import annotations

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import BaseThrottle

from controlplane.clock import timestamp

WINDOW_SECONDS = 60


def _identity(request) -> str:
    if request.auth is not None:
        return f"crd:{request.auth.public_id}"
    if request.user is not None:
        return f"mem:{request.user.public_id}"
    return f"ip:{request.META.get('REMOTE_ADDR', '')}"


class CredentialRateThrottle(BaseThrottle):
    def allow_request(self, request, view):
        limit = settings.RATE_LIMIT_PER_MINUTE
        # A long-poll re-reading its feed is one request, counted once.
        if limit <= 0 or getattr(request._request, "switchboard_repoll", False):
            return True
        now = timestamp()
        key = f"rl:{_identity(request)}:{int(now // WINDOW_SECONDS)}"
        if cache.add(key, 1, WINDOW_SECONDS * 2):
            count = 1
        else:
            try:
                count = cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.add(key, 1, WINDOW_SECONDS * 2)
                count = 1
        self._wait = WINDOW_SECONDS - (now % WINDOW_SECONDS)
        return count <= limit

    def wait(self):
        return self._wait
