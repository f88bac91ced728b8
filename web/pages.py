"""Who is signed in, and how a page answers errors. What they may read is
controlplane.access, the same rule as the API's.

Pages and sockets both start here. A signed-in Django user counts only
through an active member; anything else is treated as signed out.
"""
from __future__ import annotations

import functools

from asgiref.sync import iscoroutinefunction

from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import add_never_cache_headers
from django.utils.decorators import sync_and_async_middleware
from rest_framework.exceptions import APIException

from controlplane.access import require_sender
from controlplane.api.parsers import check_text
from controlplane.errors import ApiError, Forbidden, RateLimited, Unauthenticated, from_drf
from controlplane.ratelimit import member_request_wait
from controlplane.models import Member


def member_of(user) -> Member | None:
    """The active member behind a Django user, or None."""
    if user is None or not user.is_authenticated:
        return None
    member = getattr(user, "member", None)
    return member if member is not None and member.is_active else None


# The web app's own paths: errors there are pages (or htmx fragments), not JSON.
WEB_PATHS = ("/app/", "/staff/")

# The pages load their script, style and sockets from this origin alone and
# hold no inline script or style (htmx's indicator style is off, base.html):
# markup that slipped past the templates' escaping still runs nothing.
CONTENT_SECURITY_POLICY = ("default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
                           "form-action 'self'")


def with_policy(request, response):
    if request.path.startswith(WEB_PATHS):
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response


@sync_and_async_middleware
def content_security_policy(get_response):
    """CONTENT_SECURITY_POLICY on the web app's answers (the admin and the
    API's browsable docs have their own inline scripts)."""
    if iscoroutinefunction(get_response):
        async def middleware(request):
            return with_policy(request, await get_response(request))
    else:
        def middleware(request):
            return with_policy(request, get_response(request))
    return middleware


def digits(value: str, max_digits: int = 18) -> int | None:
    """A form or query value of at most `max_digits` ASCII digits, as an
    int; else None. Bounded: Python refuses to convert more than 4,300."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= max_digits else None


def may_write(space, membership) -> bool:
    """Whether a page offers its write forms: what the API's writes would
    refuse (controlplane.access.require_sender: an observer, an archived
    space) it does not show."""
    try:
        require_sender(space, None, role=membership.role if membership is not None else None)
    except ApiError:
        return False
    return True


def wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def error_response(request, error: ApiError, *, plain: bool = False):
    """An error as the page's caller wants it: the contract's JSON shape for
    scripts, a page for browsers, and for htmx a fragment shown in the
    page's error area (never swapped into the element the request would
    replace). `plain`, for a lost database or Redis: rendered without the
    request, whose context processors read the session, the member and
    their inbox, and on a page that reads nothing (web/unavailable.html)."""
    if wants_json(request):
        return error.json_response()  # with the error's headers
    htmx = bool(request.headers.get("HX-Request"))
    if plain:
        template = "web/_error.html" if htmx else "web/unavailable.html"
        response = HttpResponse(render_to_string(template, {"error": error}), status=error.status)
    else:
        response = render(request, "web/_error.html" if htmx else "web/error.html", {"error": error},
                          status=error.status)
    if htmx:
        response["HX-Retarget"], response["HX-Reswap"] = "#htmx-error", "innerHTML"
    for name, value in error.headers.items():
        response[name] = value
    return response


def member_page(view):
    """A page for signed-in members: others go to the sign-in page (scripts
    get 401). The view receives the member; an ApiError it raises becomes a
    clear error with the same status the API would give. What it answers
    is the member's own: never kept by a browser or a cache on the way
    (Back after signing out asks the server again)."""
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        response = _member_page(view, request, *args, **kwargs)
        add_never_cache_headers(response)
        return response
    return wrapper


def _member_page(view, request, *args, **kwargs):
    member = member_of(request.user)
    if member is None:
        if wants_json(request) or request.headers.get("HX-Request"):
            return error_response(request, Unauthenticated("Sign in again."))
        if request.user.is_authenticated:
            # Signed in, but not as an active member (suspended, or a user
            # without a member): the sign-in page would send them back here.
            return error_response(request, Forbidden(
                "This account is not an active member of Switchboard. Sign out, then sign in as a member."))
        return redirect_to_login(request.get_full_path())
    try:
        # Pages and actions share the member's API budget (RATE_LIMIT_PER_MINUTE).
        if wait := member_request_wait(member):
            raise RateLimited.after(wait)
        # Query and form values reach the database as the API's do: storable text only.
        check_text({"query": dict(request.GET.lists()), "form": dict(request.POST.lists())})
        return view(request, member, *args, **kwargs)
    except ApiError as error:
        return error_response(request, error)
    except APIException as error:  # the API's own input checks, reused by a page
        return error_response(request, from_drf(error))
