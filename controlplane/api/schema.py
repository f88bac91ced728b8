"""What the views say about themselves in the OpenAPI schema: every route
documents the error codes it can answer.

`extend_schema` and `extend_schema_view` are drf-spectacular's, applied
when the schema is built (controlplane.api.openapi) rather than when a view
module is imported: drf-spectacular's decorators load its schema generator,
and with it `django.test` and `unittest` (3 MiB), in every process that
imports a view. Served requests never need it."""
from __future__ import annotations

import threading

from drf_spectacular import utils
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

ERROR_STATUS = {
    "INVALID_REQUEST": 400, "INVALID_IDEMPOTENCY_KEY": 400, "INVALID_CURSOR": 400, "INVALID_EVENT_ID": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403, "GRANT_REQUIRED": 403, "AUTHORITY_REVOKED": 403,
    "NOT_FOUND": 404, "UNKNOWN_DELIVERY": 404, "UNKNOWN_EVENT": 404,
    "METHOD_NOT_ALLOWED": 405,
    "IDEMPOTENCY_CONFLICT": 409, "GRANT_CONFLICT": 409, "LIMIT_EXCEEDED": 409, "CONFLICT": 409,
    "RESYNC_REQUIRED": 410,
    "BODY_TOO_LARGE": 413,
    "INVALID_BODY": 422, "VERIFICATION_FAILED": 422, "INVALID_URL": 422,
    "RATE_LIMITED": 429,
    "UNAVAILABLE": 503,
    "MAILBOX_FULL": 507,
}


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.ChoiceField(choices=sorted(ERROR_STATUS))
    message = serializers.CharField()
    details = serializers.DictField()


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


def errors(*codes: str) -> dict[int, OpenApiResponse]:
    """Error responses for `codes`, plus those every route can give (a bad
    credential is 401 even where anonymous callers are welcome; an
    unreachable database is 503)."""
    every = ["RATE_LIMITED", "UNAUTHENTICATED", "UNAVAILABLE"]
    by_status: dict[int, list[str]] = {}
    for code in [*codes, *every]:
        by_status.setdefault(ERROR_STATUS[code], [])
        if code not in by_status[ERROR_STATUS[code]]:
            by_status[ERROR_STATUS[code]].append(code)
    return {
        status: OpenApiResponse(ErrorSerializer, description="Error codes: " + ", ".join(f"`{c}`" for c in names))
        for status, names in sorted(by_status.items())
    }


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", {"type": "string", "pattern": "^[!-~]{8,128}$"}, OpenApiParameter.HEADER, required=False,
    description="8–128 visible ASCII characters; a retry with the same key and request replays the original response.",
)
CURSOR = OpenApiParameter("cursor", str, description="Opaque cursor from a previous page (exclusive).")
LIMIT = OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 100},
                         description="Page size, 1–100 (default 50).")
INBOX_LIMIT = OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 50},
                               description="Items a page holds at most, 1–50 (default 50); "
                                           "2 MiB of content bounds it too.")
MAX_BYTES = OpenApiParameter("max_bytes", {"type": "integer", "minimum": 4, "maximum": 8192},
                             description="Page size in bytes, 4–8192 (default 8192).")
SNAPSHOT_PAGE = OpenApiParameter("page", str, description="`next_page` of the previous page of this snapshot.")
WAIT_MS = OpenApiParameter("wait_ms", {"type": "integer", "minimum": 0, "maximum": 30000},
                           description="Long-poll up to this many milliseconds (0–30000).")


class _Deferred:
    """A drf-spectacular decorator, noted now and applied by `apply_deferred`."""

    def __init__(self, name: str, kwargs: dict):
        self.name, self.kwargs = name, kwargs

    def __call__(self, target):
        with _lock:
            _pending.append((self, target))
        return target

    def real(self):
        kwargs = {key: value.real() if isinstance(value, _Deferred) else value
                  for key, value in self.kwargs.items()}
        return getattr(utils, self.name)(**kwargs)


_pending: list[tuple[_Deferred, object]] = []
_lock = threading.Lock()


def extend_schema(**kwargs) -> _Deferred:
    return _Deferred("extend_schema", kwargs)


def extend_schema_view(**kwargs) -> _Deferred:
    return _Deferred("extend_schema_view", kwargs)


def apply_deferred() -> None:
    """Apply every decorator noted so far, in the order the views were
    decorated: what drf-spectacular's would have done at import."""
    with _lock:
        while _pending:
            decorator, target = _pending.pop(0)
            if decorator.real()(target) is not target:
                raise TypeError(f"{decorator.name} replaced {target!r}")
