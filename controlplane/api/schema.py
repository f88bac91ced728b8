"""OpenAPI helpers: every route documents the error codes it can answer."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
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


def add_body_limit(result, generator, request, public):
    """Postprocessing hook: a request body over DATA_UPLOAD_MAX_MEMORY_SIZE
    is 413 BODY_TOO_LARGE before any view runs, so every route that takes a
    body lists it."""
    for operations in result["paths"].values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if "requestBody" in operation and "413" not in responses and "401" in responses:
                responses["413"] = {**responses["401"], "description": "Error codes: `BODY_TOO_LARGE`"}
    return result


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="8–128 visible ASCII characters; a retry with the same key and request replays the original response.",
)
CURSOR = OpenApiParameter("cursor", str, description="Opaque cursor from a previous page (exclusive).")
LIMIT = OpenApiParameter("limit", int, description="Page size, 1–100 (default 50).")
MAX_BYTES = OpenApiParameter("max_bytes", int, description="Page size in bytes, 4–8192 (default 8192).")
SNAPSHOT_PAGE = OpenApiParameter("page", str, description="`next_page` of the previous page of this snapshot.")
WAIT_MS = OpenApiParameter("wait_ms", int, description="Long-poll up to this many milliseconds (0–30000).")


class SwitchboardAutoSchema(AutoSchema):
    def get_auth(self):
        from controlplane.api.permissions import ReadableAnonymously

        auth = super().get_auth()
        anonymous_reads = any(isinstance(p, ReadableAnonymously) for p in self.view.get_permissions())
        if anonymous_reads and self.method == "GET" and {} not in auth:
            auth.append({})
        return auth

    def get_tags(self):
        return [self.path.split("/")[2] if self.path.count("/") >= 2 else "switchboard"]


class BearerScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.api.authentication.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A credential token, `sbt_…`."}


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.api.authentication.MemberSessionAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
