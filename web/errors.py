"""Django-level error handlers (named by the composition root: urls.py and
settings.CSRF_FAILURE_VIEW): the web app answers a browser on its own pages
in HTML, everyone else gets the contract's JSON (controlplane.errors)."""
from __future__ import annotations

from controlplane import errors
from controlplane.errors import ApiError, Forbidden, NotFound
from web.pages import error_response


def _web_page(request, error: ApiError):
    if request.path.startswith(("/app/", "/staff/")) and "text/html" in request.headers.get("Accept", ""):
        return error_response(request, error)
    return None


def not_found(request, exception=None):
    page = _web_page(request, NotFound("There is no such page."))
    return page if page is not None else errors.not_found(request, exception)


def csrf_failure(request, reason=""):
    page = _web_page(request, Forbidden("The form expired or came from another site. Reload the page and try again."))
    return page if page is not None else errors.csrf_failure(request, reason)
