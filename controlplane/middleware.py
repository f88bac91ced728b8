"""Request checks that come before everything else."""
from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class HostCheck:
    """Every request must name an allowed host (ALLOWED_HOSTS): Django checks
    it only where something asks for the host, so ask on every request (a
    wrong host is 400). /healthz is exempt: load balancers probe it by
    address."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if request.path != "/healthz":
            request.get_host()  # DisallowedHost → 400
        return self.get_response(request)
