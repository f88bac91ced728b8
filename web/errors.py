"""Django-level error handlers (named by the composition root: urls.py,
settings.CSRF_FAILURE_VIEW and settings.MIDDLEWARE): the web app answers a
browser on its own pages in HTML, everyone else gets the contract's JSON
(controlplane.errors)."""
from __future__ import annotations

import io

from django.core.handlers.asgi import ASGIRequest
from django.utils.deprecation import MiddlewareMixin

from controlplane import errors
from controlplane.errors import ApiError, Forbidden, NotFound, RateLimited
from controlplane.ratelimit import address_wait, client_address
from web.pages import WEB_PATHS, error_response, with_policy


def _web_page(request, error: ApiError, *, plain: bool = False):
    """The error as a page (or, for htmx, a message in the page's error
    area) for a browser on the web app's paths; None for anyone else."""
    browser = "text/html" in request.headers.get("Accept", "") or request.headers.get("HX-Request")
    if request.path.startswith(WEB_PATHS) and browser:
        return error_response(request, error, plain=plain)
    return None


def refusal_page(scope: dict, error: ApiError):
    """`_web_page` for a request refused before Django read it
    (controlplane.bodylimit: a form past the body limit), from its head
    alone, and plain: its session was never looked at."""
    request = ASGIRequest(scope, io.BytesIO())
    page = _web_page(request, error, plain=True)
    if page is not None:  # what the middleware gives every page of the web app's
        with_policy(request, page)
        page.headers.setdefault("X-Frame-Options", "DENY")
        page.headers.setdefault("X-Content-Type-Options", "nosniff")
    return page


def not_found(request, exception=None):
    page = _web_page(request, NotFound("There is no such page."))
    return page if page is not None else errors.not_found(request, exception)


def unknown_route(request):
    """No route: 404, counted against the caller's address as an anonymous
    request is (429 past RATE_LIMIT_PER_MINUTE): it was a request no budget
    saw."""
    if (wait := address_wait(client_address(request))) is not None:
        return RateLimited.after(wait).json_response()
    return not_found(request)


class ServiceUnavailable(MiddlewareMixin):
    """Middleware, last in the chain so that it sees a view's exception
    first: a page, an action or the admin whose database or Redis is out of
    reach (a restart, a failover) answers 503 UNAVAILABLE with Retry-After,
    as the API does (controlplane.errors.as_unavailable), not a logged 500.
    Its page and fragment are rendered without the request (whose context
    processors read the database): `error_response(plain=True)`. (With
    only this hook, Django's mixin adds no thread hop to an async chain.)"""

    def process_exception(self, request, exception):
        error = errors.as_unavailable(exception)
        if error is None:
            return None
        if request.path.startswith(WEB_PATHS):
            return error_response(request, error, plain=True)
        return error.json_response()


def csrf_failure(request, reason=""):
    page = _web_page(request, Forbidden("The form expired or came from another site. Reload the page and try again."))
    return page if page is not None else errors.csrf_failure(request, reason)
