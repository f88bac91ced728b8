"""Content negotiation that never refuses: the API answers JSON, its one
format, whatever `Accept` asks for (SPEC §2); a view with more formats (the
schema's YAML) still answers the one asked for."""
from __future__ import annotations

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class JsonWhateverAccepted(DefaultContentNegotiation):
    """DRF's negotiation, falling back to the view's first renderer where
    it would answer 406 (a status the contract does not have, and which
    came before authentication: an anonymous `Accept: text/html` got 406,
    not 401), or 404 for a `?format=` it has no renderer for."""

    def filter_renderers(self, renderers, format):
        # (a `?format=` no renderer has was a 404 on a route that exists)
        return [renderer for renderer in renderers if renderer.format == format] or renderers

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type
