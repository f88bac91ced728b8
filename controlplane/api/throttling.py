"""The API's rate limits (controlplane.ratelimit counts them)."""
from __future__ import annotations

from rest_framework.throttling import BaseThrottle

from controlplane.ratelimit import address_wait, client_address, member_request_wait


class _Throttle(BaseThrottle):
    _wait: float | None = None

    def wait(self):
        return self._wait


class MemberRateThrottle(_Throttle):
    """RATE_LIMIT_PER_MINUTE per member, however many credentials they hold
    (anonymous callers: per client address)."""

    def allow_request(self, request, view):
        django_request = request._request
        if hasattr(django_request, "switchboard_rate_wait"):
            # A bearer credential: counted with its check (BearerTokenAuthentication).
            self._wait = django_request.switchboard_rate_wait
        elif getattr(django_request, "switchboard_repoll", False):
            return True  # a long-poll re-reading its feed is one request, counted once
        elif request.user is not None:
            self._wait = member_request_wait(request.user)
        else:
            self._wait = address_wait(client_address(request))
        return self._wait is None

