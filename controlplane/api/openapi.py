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


# What every write route can answer before (or as) its view reads the body,
# declared or not (an action's `EmptyIn` is parsed too): a body past
# DATA_UPLOAD_MAX_MEMORY_SIZE, one not sent as JSON, and JSON holding text no
# column takes (a NUL, a lone surrogate).
WRITES = ("post", "put", "patch", "delete")
BODY_ERRORS = (("413", "BODY_TOO_LARGE"), ("415", "INVALID_REQUEST"), ("422", "INVALID_BODY"))


def add_body_limit(result, generator, request, public):
    """Postprocessing hook: every write route lists BODY_ERRORS."""
    for operations in result["paths"].values():
        for method, operation in operations.items():
            responses = operation.get("responses", {})
            if method not in WRITES or "401" not in responses:
                continue
            for status, code in BODY_ERRORS:
                if status not in responses:
                    responses[status] = {**responses["401"], "description": f"Error codes: `{code}`"}
                elif f"`{code}`" not in responses[status]["description"]:
                    responses[status] = {**responses[status],
                                         "description": f"{responses[status]['description']}, `{code}`"}
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

    def get_operation_id(self):
        """A view that serves several actions from one class names each
        (`operation_id` with `{action}` in it), where the generated id
        would be the path's (`spaces_tasks_claim_create`)."""
        named = getattr(self.view, "operation_id", None)
        if named and getattr(self.view, "action", None):
            return named.format(action=self.view.action)
        return super().get_operation_id()


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
