"""`/v0/schema/`, loaded at its first request (controlplane.urls.schema_view):
drf-spectacular's view and generator load django.test and the schema's
extensions (controlplane.api.openapi)."""
from __future__ import annotations

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.views import SpectacularAPIView


class BuiltOnce(SchemaGenerator):
    """The schema, built at its first request and kept for the process's
    life, per API version: the routes and their annotations do not change
    while it runs, and a build cost about 0.2 s of CPU, which anyone could
    ask for as often as the anonymous rate limit allows."""

    built: dict = {}

    def get_schema(self, request=None, public=False):
        key = (self.api_version, public)
        if key not in self.built:
            self.built[key] = super().get_schema(request=request, public=public)
        return self.built[key]


class SchemaView(SpectacularAPIView):
    """`/v0/schema/`: each request renders the schema built once."""

    generator_class = BuiltOnce
