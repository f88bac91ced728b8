"""Errors are values with codes, mapped once to the contract's shape:
`{"error": {"code": "…", "message": "…", "details": {…}}}`.
"""
from __future__ import annotations

import logging
import re
import sys

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from django.views.debug import SafeExceptionReporterFilter
from rest_framework import exceptions as drf
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

logger = logging.getLogger("switchboard.errors")


class ApiError(Exception):
    status = 400
    code = "INVALID_REQUEST"
    message = "The request is invalid."

    def __init__(self, message: str | None = None, *, details: dict | None = None, code: str | None = None,
                 status: int | None = None, headers: dict | None = None):
        self.message = message or self.message
        self.details = details or {}
        self.code = code or self.code
        self.status = status or self.status
        self.headers = headers or {}
        super().__init__(self.message)

    def body(self) -> dict:
        return error_body(self.code, self.message, self.details)

    def field_problems(self) -> list[str]:
        """Each refused field with its reasons, `rules[1].min_bytes: …`, for
        pages to show what `details.fields` tells a script."""
        return list(_problems(self.details.get("fields") or {}, ""))

    def json_response(self) -> JsonResponse:
        """For Django's handlers and middleware, outside DRF's views."""
        return JsonResponse(self.body(), status=self.status, headers=self.headers)


def _problems(fields, path: str):
    if isinstance(fields, dict):
        named = fields.items()
    elif isinstance(fields, list) and not all(isinstance(reason, str) for reason in fields):
        named = enumerate(fields)
    else:  # a field's reasons
        reasons = " ".join(fields) if isinstance(fields, list) else str(fields)
        yield f"{path}: {reasons}" if path else reasons
        return
    for name, value in named:  # a list's rows by their index, as DRF names them
        yield from _problems(value, (f"{path}[{name}]" if str(name).isdigit() else f"{path}.{name}") if path
                             else str(name))


class InvalidRequest(ApiError):
    pass


class InvalidIdempotencyKey(ApiError):
    code = "INVALID_IDEMPOTENCY_KEY"
    message = "Idempotency-Key must be 8–128 visible ASCII characters."


class InvalidCursor(ApiError):
    code = "INVALID_CURSOR"
    message = "The cursor is invalid for this caller and stream."


# RFC 9110 §11.6.1: every 401 names the scheme that would be accepted.
WWW_AUTHENTICATE = 'Bearer realm="switchboard"'


class Unauthenticated(ApiError):
    status, code, message = 401, "UNAUTHENTICATED", "Authentication credentials are missing or invalid."

    def __init__(self, message: str | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.headers.setdefault("WWW-Authenticate", WWW_AUTHENTICATE)


class Forbidden(ApiError):
    status, code, message = 403, "FORBIDDEN", "You are not allowed to do this."


class GrantRequired(ApiError):
    status, code, message = 403, "GRANT_REQUIRED", "Sending here needs a grant covering every recipient."

    def __init__(self, message: str | None = None, *, uncovered: list | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.uncovered = uncovered or []  # the members no grant covers


class AuthorityRevoked(ApiError):
    status, code, message = 403, "AUTHORITY_REVOKED", "The authority this message was sent under is no longer active."


class NotFound(ApiError):
    status, code, message = 404, "NOT_FOUND", "Not found."


class UnknownDelivery(ApiError):
    status, code, message = 404, "UNKNOWN_DELIVERY", "No such delivery token in your inbox."


class UnknownEvent(ApiError):
    status, code, message = 404, "UNKNOWN_EVENT", "No such inbox event."


class InvalidEventId(ApiError):
    code, message = "INVALID_EVENT_ID", "An event id is evt_ followed by 43 canonical base64url characters."


class Conflict(ApiError):
    status, code, message = 409, "CONFLICT", "The request conflicts with the current state."


class GrantConflict(ApiError):
    status, code, message = 409, "GRANT_CONFLICT", "This grant id is taken by a different grant."


class LimitExceeded(ApiError):
    status, code, message = 409, "LIMIT_EXCEEDED", "A limit would be exceeded."


class IdempotencyConflict(ApiError):
    status, code, message = 409, "IDEMPOTENCY_CONFLICT", "This Idempotency-Key was used with a different request."


class ResyncRequired(ApiError):
    status, code, message = 410, "RESYNC_REQUIRED", "The cursor is older than the retention floor; take a fresh snapshot."


class BodyTooLarge(ApiError):
    status, code, message = 413, "BODY_TOO_LARGE", "The body is larger than allowed."


class InvalidBody(ApiError):
    status, code, message = 422, "INVALID_BODY", "The body is not valid text."


class VerificationFailed(ApiError):
    status, code, message = 422, "VERIFICATION_FAILED", "The receiver did not answer the challenge."


class InvalidUrl(ApiError):
    status, code, message = 422, "INVALID_URL", "The URL is not an acceptable webhook target."


class MailboxFull(ApiError):
    status, code, message = 507, "MAILBOX_FULL", "A recipient's pending inbox is full."


class RateLimited(ApiError):
    status, code, message = 429, "RATE_LIMITED", "Too many requests."

    @classmethod
    def after(cls, wait: float, message: str | None = None) -> "RateLimited":
        seconds = max(1, int(wait + 0.999))
        return cls(message, details={"retry_after": seconds}, headers={"Retry-After": str(seconds)})


class Unavailable(ApiError):
    """The database or Redis could not be reached (restarting, failing
    over): nothing was done that a retry would repeat (sends and other
    writes take an Idempotency-Key for the case where the outcome is
    unknown)."""

    status, code, message = 503, "UNAVAILABLE", "The service is briefly unavailable; retry."

    def __init__(self):
        super().__init__(details={"retry_after": 1}, headers={"Retry-After": "1"})


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def from_drf(exc: drf.APIException) -> ApiError:
    """A DRF exception (a serializer's ValidationError, say) as the contract's error."""
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        return Unauthenticated(str(exc.detail) if isinstance(exc, drf.AuthenticationFailed) else None)
    if isinstance(exc, drf.PermissionDenied):
        return Forbidden()
    if isinstance(exc, drf.NotFound):
        return NotFound()
    if isinstance(exc, drf.MethodNotAllowed):
        return ApiError(str(exc.detail), status=405, code="METHOD_NOT_ALLOWED")
    if isinstance(exc, drf.UnsupportedMediaType):
        return ApiError("Send JSON with Content-Type: application/json.", status=415, code="INVALID_REQUEST")
    if isinstance(exc, drf.Throttled):
        return RateLimited.after(exc.wait or 1)
    if isinstance(exc, drf.ValidationError):
        return InvalidRequest("The request has invalid fields.", details={"fields": exc.detail})
    if isinstance(exc, drf.ParseError):
        return InvalidRequest(str(exc.detail))
    return ApiError(str(exc.detail), status=exc.status_code)


def _lost_service(exc) -> str | None:
    """Which backing service `exc` says is out of reach: the database, or
    Redis (the cache: rate limits, remembered lookups; matched without
    importing redis where nothing uses it), else None."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return "database"
    errors = sys.modules.get("redis.exceptions")
    if errors is not None and isinstance(exc, (errors.ConnectionError, errors.TimeoutError)):
        return "Redis"
    return None


def warn_of(log: logging.Logger, message: str, *args) -> None:
    """Log the exception being handled, at WARNING: a lost database or
    Redis (an outage, told every second while it lasts, and by /readyz) in
    one line with its reason; anything else with its traceback."""
    exc = sys.exc_info()[1]
    if exc is not None and _lost_service(exc) is not None:
        log.warning(f"{message}: %s", *args, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    else:
        log.warning(message, *args, exc_info=True)


def as_unavailable(exc) -> Unavailable | None:
    """`Unavailable` (503, retry) if `exc` is a lost database or Redis (a
    restart, a failover), logged as such; else None. Every surface answers
    such a loss this way: the API, the web app, `/mcp`."""
    service = _lost_service(exc)
    if service is None:
        return None
    logger.warning("%s unavailable: %s", service, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return Unavailable()


def api_exception_handler(exc, context):
    """DRF's EXCEPTION_HANDLER: every error leaves in the contract's shape."""
    if isinstance(exc, Http404):
        exc = NotFound()
    elif isinstance(exc, RequestDataTooBig):
        exc = BodyTooLarge("The request is too large.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = Forbidden()
    elif isinstance(exc, SuspiciousOperation):
        exc = InvalidRequest("The request was rejected.")
    elif isinstance(exc, drf.APIException):
        exc = from_drf(exc)
    elif (unavailable := as_unavailable(exc)) is not None:
        exc = unavailable
    if not isinstance(exc, ApiError):
        logger.exception("unhandled error in API view", exc_info=exc)
        exc = ApiError("Internal error.", status=500, code="INTERNAL")
    if isinstance(exc, Unauthenticated):
        exc = refused_credential(context["request"]) or exc
    if (request := context.get("request")) is not None:
        # In JSON whatever the route renders (the schema's YAML, its docs' HTML).
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
    return Response(exc.body(), status=exc.status, headers=exc.headers)


def refused_credential(request) -> RateLimited | None:
    """A request refused for its credential (the permission check and the
    credential check run before the throttle) counts against its client
    address as an anonymous one does: RateLimited past the limit."""
    from controlplane.ratelimit import address_wait, client_address

    wait = address_wait(client_address(request))
    return RateLimited.after(wait) if wait is not None else None


# Django-level handlers for errors raised outside DRF views.
def _json(code: str, message: str, status: int) -> JsonResponse:
    return ApiError(message, code=code, status=status).json_response()


def bad_request(request, exception=None):
    return _json("INVALID_REQUEST", "The request is invalid.", 400)


def permission_denied(request, exception=None):
    return _json("FORBIDDEN", "You are not allowed to do this.", 403)


def not_found(request, exception=None):
    return _json("NOT_FOUND", "Not found.", 404)


def server_error(request):
    return _json("INTERNAL", "Internal error.", 500)


def csrf_failure(request, reason=""):
    return _json("FORBIDDEN", "CSRF verification failed.", 403)


class ReporterFilter(SafeExceptionReporterFilter):
    """What DEBUG's error pages show (DEFAULT_EXCEPTION_REPORTER_FILTER):
    Django's hidden settings, and the connection URLs too (DATABASE_URL,
    REDIS_URL), whose passwords Django's names (PASS, KEY…) do not match."""

    hidden_settings = re.compile(SafeExceptionReporterFilter.hidden_settings.pattern + "|_URL$", flags=re.I)
