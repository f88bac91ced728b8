"""The OpenAPI schema's hooks, schema class and extensions, loaded only to
build the schema (`/v0/schema/`, `manage.py spectacular`, the tests), with
drf-spectacular's generator, which imports `django.test`."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema

from controlplane.api.schema import apply_deferred


def apply_annotations(endpoints):
    """Preprocessing hook: every view is imported by now (the generator
    read the URLconf) and no view's schema has been built yet, so the views'
    annotations (controlplane.api.schema) apply here."""
    apply_deferred()
    return endpoints


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
