"""Request checks that come before everything else."""
from __future__ import annotations

from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import DisallowedHost, TooManyFieldsSent
from django.http.request import split_domain_port, validate_host
from django.utils.decorators import sync_and_async_middleware

from controlplane.errors import ApiError, Forbidden, InvalidRequest
from controlplane.tracing import HEADER, begin_request, current_request_id, end_request


def _allowed(host: str | None) -> bool:
    return bool(host) and validate_host(host, settings.ALLOWED_HOSTS)


def host_check(headers: dict) -> ApiError | None:
    """Django's own Host check (ALLOWED_HOSTS, with its subdomain and
    wildcard forms) for `Host`, and for `Origin` when a browser sends one,
    for the ASGI applications Django's handler does not serve (`/mcp`, the
    WebSockets): the DNS-rebinding protection the MCP transport asks for,
    from the setting the rest of the server uses. `headers` as an ASGI
    scope's, by name."""
    domain, _ = split_domain_port(headers.get(b"host", b"").decode("latin-1"))
    if not _allowed(domain):
        return _not_served()
    origin = headers.get(b"origin")
    if origin is not None and not _allowed(urlsplit(origin.decode("latin-1")).hostname):
        return Forbidden("Requests from this origin are not accepted.", details={"reason": "origin"})
    return None


def _not_served() -> ApiError:
    return InvalidRequest("This host is not served here.", details={"reason": "host"})


class HostCheck:
    """Every request must name an allowed host (ALLOWED_HOSTS): Django checks
    it only where something asks for the host, so ask on every request (a
    wrong host is 400). The probes (PROBE_PATHS: /healthz, /readyz) are
    exempt: load balancers probe them by address.

    And its query string must parse (at most DATA_UPLOAD_MAX_NUMBER_FIELDS
    fields): read here, it is a 400 in the contract's shape whatever reads
    it later. Read first by a view or a middleware, it was a 400 only
    without DEBUG: Django's debug page read it again, and failed with 500."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        try:
            if request.path not in settings.PROBE_PATHS:
                request.get_host()
            request.GET
        except DisallowedHost:  # answered here: with DEBUG, Django's own answer was its debug page
            refused = _not_served().json_response()
        except TooManyFieldsSent:
            refused = InvalidRequest("Too many query parameters.").json_response()
        else:
            return self.get_response(request)
        return _now(refused) if self.is_async else refused


async def _now(response):
    return response


class RequestId:
    """Every request runs under a request id (controlplane.tracing): the
    client's `X-Request-Id` if it is a safe one, else a new one; the
    response names it. Its logs, and the events and wakes it causes, carry
    it. First in the chain, so every answer has it (a refused host too).
    Under the ASGI application, `tracing.with_request_id` has set and names
    it already, before the body limit and the static files: this leaves it."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        if current_request_id() is not None:
            return self.get_response(request)
        request_id, token = begin_request(request.headers.get(HEADER))
        try:
            response = self.get_response(request)
        finally:
            end_request(token)
        response[HEADER] = request_id
        return response

    async def _acall(self, request):
        if current_request_id() is not None:
            return await self.get_response(request)
        request_id, token = begin_request(request.headers.get(HEADER))
        try:
            response = await self.get_response(request)
        finally:
            end_request(token)
        response[HEADER] = request_id
        return response



def answers_not_stored(application):
    """An ASGI application whose answers say `Cache-Control: no-store`
    (`/mcp`, which Django's middleware does not see: tool results carry
    delivery tokens and message bodies), beside what the answer says already
    (its event streams' `no-cache, no-transform`)."""
    async def call(scope, receive, send):
        async def send_not_stored(message):
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", [])
                           if name.lower() != b"cache-control"]
                said = [value for name, value in message.get("headers", []) if name.lower() == b"cache-control"]
                value = b", ".join([b"no-store", *(v for v in said if b"no-store" not in v)])
                message = {**message, "headers": [*headers, (b"cache-control", value)]}
            await send(message)

        return await application(scope, receive, send_not_stored if scope["type"] == "http" else send)

    return call


@sync_and_async_middleware
def api_answers_no_store(get_response):
    """API answers are their caller's own (a new credential's token,
    delivery tokens, message bodies): `Cache-Control: no-store`, as the web
    app's pages and `/mcp` (`answers_not_stored`) say, unless the view said otherwise. A browser
    calls the API too (`/v0/docs/`)."""
    def mark(request, response):
        if request.path.startswith("/v0/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    if iscoroutinefunction(get_response):
        async def middleware(request):
            return mark(request, await get_response(request))
    else:
        def middleware(request):
            return mark(request, get_response(request))
    return middleware
