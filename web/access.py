"""Who is signed in, and what they may read: the same checks as the API.

Pages and sockets both start here. A signed-in Django user counts only
through an active member; anything else is treated as signed out.
"""
from __future__ import annotations

import functools

from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.shortcuts import render

from controlplane.errors import ApiError, Forbidden, NotFound, Unauthenticated
from controlplane.models import Conversation, Member, Membership, Space


def member_of(user) -> Member | None:
    """The active member behind a Django user, or None."""
    if user is None or not user.is_authenticated:
        return None
    member = getattr(user, "member", None)
    return member if member is not None and member.is_active else None


def readers_of(conversation: Conversation, members: set[int]) -> set[int]:
    """Which of `members` (pks) may read `conversation` now, in one query:
    active members, with an active membership unless the space is open, and
    taking part unless it is a channel. The API's rules
    (selectors.can_read_space and readable_conversations), for many members
    at once."""
    found = Member.objects.filter(pk__in=members, status=Member.Status.ACTIVE)
    if conversation.space.visibility != Space.Visibility.OPEN:
        found = found.filter(memberships__space_id=conversation.space_id,
                             memberships__status=Membership.Status.ACTIVE)
    if conversation.kind != Conversation.Kind.CHANNEL:
        found = found.filter(participations__conversation=conversation)
    return set(found.values_list("pk", flat=True))


def readable_conversation(member: Member | None, public_id: str) -> Conversation | None:
    """The conversation, with its space, if `member` may read it now."""
    if member is None or not member.is_active:
        return None
    conversation = Conversation.objects.select_related("space").filter(public_id=public_id).first()
    if conversation is None or member.pk not in readers_of(conversation, {member.pk}):
        return None
    return conversation


def get_readable_conversation(member: Member, public_id: str) -> Conversation:
    conversation = readable_conversation(member, public_id)
    if conversation is None:
        raise NotFound("No such conversation, or you cannot read it.")
    return conversation


def wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def error_response(request, error: ApiError):
    """An error as the page's caller wants it: the contract's JSON shape for
    scripts, a page for browsers, and for htmx a fragment shown in the page's
    error area (never swapped into the element the request would replace)."""
    if wants_json(request):
        return JsonResponse(error.body(), status=error.status)
    if request.headers.get("HX-Request"):
        response = render(request, "web/_error.html", {"error": error}, status=error.status)
        response["HX-Retarget"], response["HX-Reswap"] = "#htmx-error", "innerHTML"
        return response
    return render(request, "web/error.html", {"error": error}, status=error.status)


def member_page(view):
    """A page for signed-in members: others go to the sign-in page (scripts
    get 401). The view receives the member; an ApiError it raises becomes a
    clear error with the same status the API would give."""
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
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
            return view(request, member, *args, **kwargs)
        except ApiError as error:
            return error_response(request, error)
    return wrapper
