"""`/v0/schema/`, loaded at its first request (controlplane.urls.schema_view):
drf-spectacular's view and generator load django.test and the schema's
extensions (controlplane.api.openapi)."""
from __future__ import annotations

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.views import SpectacularAPIView


class BuiltOnce(SchemaGenerator):
    """The schema, built at its first request and kept for the process's
    life: the routes and their annotations do not change while it runs,
    and a build cost about 0.2 s of CPU, which anyone could ask for as
    often as the anonymous rate limit allows."""

    built: dict = {}

    def get_schema(self, request=None, public=False):
        if public not in self.built:
            self.built[public] = super().get_schema(request=request, public=public)
        return self.built[public]


class SchemaView(SpectacularAPIView):
    """`/v0/schema/`: each request renders the schema built once. The API
    has one version: a `?version=` is not one of the schema's (kept per
    version, every new value was a build kept for good)."""

    generator_class = BuiltOnce

    def _get_version_parameter(self, request):
        return None
