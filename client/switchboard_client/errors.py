"""One exception class per error code of the API, grouped by what a caller
does about it (the command line maps each group to an exit code).

    SwitchboardError                      status, code, message, details, retry_after
    ├── RequestError        exit 2        the request itself is wrong
    ├── AuthError           exit 3        who you are, or what you may do
    ├── NotFoundError       exit 4        absent, invisible, or past retention
    ├── ConflictError       exit 5        the current state says no
    ├── RateLimitError      exit 6        too many requests: wait `retry_after`
    └── ServerError         exit 7        the server or the connection failed
"""
from __future__ import annotations

import inspect
import math

from collections.abc import Mapping


class SwitchboardError(Exception):
    """An error answer of the API (`{"error": {code, message, details}}`), or
    a connection that failed (`status` None)."""

    exit_code = 1
    default_status: int | None = None
    default_code = "ERROR"

    def __init__(self, message: str = "", *, status: int | None = None, code: str | None = None,
                 details: Mapping | None = None, retry_after: float | None = None, headers: Mapping | None = None):
        super().__init__(message or self.default_code)
        self.message = message
        self.status = self.default_status if status is None else status
        self.code = code or self.default_code
        self.details = dict(details or {})
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class RequestError(SwitchboardError):
    exit_code, default_status, default_code = 2, 400, "INVALID_REQUEST"


class AuthError(SwitchboardError):
    exit_code, default_status, default_code = 3, 403, "FORBIDDEN"


class NotFoundError(SwitchboardError):
    exit_code, default_status, default_code = 4, 404, "NOT_FOUND"


class ConflictError(SwitchboardError):
    exit_code, default_status, default_code = 5, 409, "CONFLICT"


class RateLimitError(SwitchboardError):
    exit_code, default_status, default_code = 6, 429, "RATE_LIMITED"


class ServerError(SwitchboardError):
    exit_code, default_status, default_code = 7, 500, "INTERNAL"


def _code(group: type[SwitchboardError], name: str, status: int, code: str, doc: str) -> type[SwitchboardError]:
    return type(name, (group,), {"default_status": status, "default_code": code, "__doc__": doc,
                                 "__module__": __name__})


# SPEC §12, plus 503 UNAVAILABLE and 500 INTERNAL.
InvalidRequest = _code(RequestError, "InvalidRequest", 400, "INVALID_REQUEST",
                       "Malformed JSON, wrong types, unknown fields (`details.fields`).")
InvalidIdempotencyKey = _code(RequestError, "InvalidIdempotencyKey", 400, "INVALID_IDEMPOTENCY_KEY",
                              "The Idempotency-Key is not 8–128 visible ASCII characters.")
InvalidCursor = _code(RequestError, "InvalidCursor", 400, "INVALID_CURSOR",
                      "A tampered, foreign or wrong-stream cursor.")
InvalidEventId = _code(RequestError, "InvalidEventId", 400, "INVALID_EVENT_ID", "A non-canonical event id.")
BodyTooLarge = _code(RequestError, "BodyTooLarge", 413, "BODY_TOO_LARGE", "The message body is over 8 KiB.")
InvalidBody = _code(RequestError, "InvalidBody", 422, "INVALID_BODY", "The body is not valid text.")
VerificationFailed = _code(RequestError, "VerificationFailed", 422, "VERIFICATION_FAILED",
                           "The receiver did not answer the challenge (`details.reason`).")
InvalidUrl = _code(RequestError, "InvalidUrl", 422, "INVALID_URL", "Not an acceptable webhook target.")
Unauthenticated = _code(AuthError, "Unauthenticated", 401, "UNAUTHENTICATED", "A missing or bad credential.")
Forbidden = _code(AuthError, "Forbidden", 403, "FORBIDDEN", "Authenticated, not allowed.")
GrantRequired = _code(AuthError, "GrantRequired", 403, "GRANT_REQUIRED",
                      "No grant covers the send (`details.approval_request` when one was asked for).")
AuthorityRevoked = _code(AuthError, "AuthorityRevoked", 403, "AUTHORITY_REVOKED",
                         "The authority the message was sent under is no longer active.")
NotFound = _code(NotFoundError, "NotFound", 404, "NOT_FOUND", "Absent or not visible.")
UnknownDelivery = _code(NotFoundError, "UnknownDelivery", 404, "UNKNOWN_DELIVERY",
                        "No such delivery token in your inbox.")
UnknownEvent = _code(NotFoundError, "UnknownEvent", 404, "UNKNOWN_EVENT", "No such inbox event.")
ResyncRequired = _code(NotFoundError, "ResyncRequired", 410, "RESYNC_REQUIRED",
                       "The cursor or snapshot is past retention: take a fresh snapshot (`details.floor`).")
IdempotencyConflict = _code(ConflictError, "IdempotencyConflict", 409, "IDEMPOTENCY_CONFLICT",
                            "The Idempotency-Key was used with a different request.")
GrantConflict = _code(ConflictError, "GrantConflict", 409, "GRANT_CONFLICT",
                      "The grant id is taken by a different grant.")
LimitExceeded = _code(ConflictError, "LimitExceeded", 409, "LIMIT_EXCEEDED", "A limit would be exceeded.")
Conflict = _code(ConflictError, "Conflict", 409, "CONFLICT", "The request conflicts with the current state.")
MailboxFull = _code(ConflictError, "MailboxFull", 507, "MAILBOX_FULL",
                    "A recipient's pending inbox is full; nothing of the send was stored.")
RateLimited = _code(RateLimitError, "RateLimited", 429, "RATE_LIMITED", "Too many requests: wait `retry_after`.")
Unavailable = _code(ServerError, "Unavailable", 503, "UNAVAILABLE",
                    "The service is briefly unavailable; nothing was done, retry.")
InternalError = _code(ServerError, "InternalError", 500, "INTERNAL", "The server failed.")
ConnectionFailed = _code(ServerError, "ConnectionFailed", None, "CONNECTION_FAILED",
                         "No answer: the connection could not be made or broke.")

BY_CODE: dict[str, type[SwitchboardError]] = {
    cls.default_code: cls for cls in (
        InvalidRequest, InvalidIdempotencyKey, InvalidCursor, InvalidEventId, BodyTooLarge, InvalidBody,
        VerificationFailed, InvalidUrl, Unauthenticated, Forbidden, GrantRequired, AuthorityRevoked, NotFound,
        UnknownDelivery, UnknownEvent, ResyncRequired, IdempotencyConflict, GrantConflict, LimitExceeded, Conflict,
        MailboxFull, RateLimited, Unavailable, InternalError)}


def group_for_status(status: int) -> type[SwitchboardError]:
    """The group of an answer whose code this client does not know."""
    if status in (401, 403):
        return AuthError
    if status in (404, 410):
        return NotFoundError
    if status in (409, 507):
        return ConflictError
    if status == 429:
        return RateLimitError
    if status >= 500:
        return ServerError
    return RequestError


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils
    import time

    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from_response(status: int, body: object, headers: Mapping[str, str]) -> SwitchboardError:
    """The exception for an error answer: by its code when known, else by its status."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    cls = BY_CODE.get(code) if code else None
    if cls is None:
        cls = group_for_status(status)
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    retry_after = parse_retry_after(headers.get("retry-after"))
    hinted = details.get("retry_after")
    if retry_after is None and isinstance(hinted, (int, float)) and math.isfinite(hinted):
        retry_after = max(0.0, float(hinted))  # the server's word, as the header's is: never below zero
    message = error.get("message") if isinstance(error.get("message"), str) else f"HTTP {status}"
    return cls(message, status=status, code=code or cls.default_code, details=details, retry_after=retry_after,
               headers=headers)


def done_synchronously(result: object, what: str) -> None:
    """Refuse what a handler returned if it is awaitable: a callback that
    needs an event loop, called where none awaits it, did not run (its
    coroutine was dropped), and its item must not count as handled."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # (never started: no "was never awaited" warning)
        raise TypeError(f"{what} returned an awaitable, which nothing here awaits: use the asynchronous form "
                        "(AsyncClient, or WakeReceiver under ASGI).")


class ConfigurationError(ValueError):
    """What the client was given cannot be used (a token that is not
    printable ASCII, an unreadable config file): nothing was sent."""
