"""A space's own page: its conversations, its member directory, and what
its members and owners do there (create channels, start direct messages
and groups, add and remove members, change roles).

Every action goes through controlplane.services, as the API's routes do,
so the rules (who may, what is valid) are the same; the page answers with
a message saying what happened, or the error the API would give."""
from __future__ import annotations

import re

from django.contrib import messages as flash
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane import services
from controlplane.access import (active_membership, can_read_space, get_space_for, may_administer,
                                 readable_conversations, visible_memberships)
from controlplane.api.fields import validated
from controlplane.api.serializers import SpaceCreateIn
from controlplane.converters import SlugConverter
from controlplane.errors import NotFound
from controlplane.models import Membership, Space
from web.pages import digits, may_write, member_page
from web.views.conversations import conversation_label, listed_conversations

DIRECTORY_PAGE = 100
LISTED = 100  # conversations a page of the space's page lists


@member_page
@require_POST
def create_space(request, member):
    fields = validated(SpaceCreateIn, {k: request.POST[k].strip() for k in SpaceCreateIn().fields if k in request.POST})
    space = services.create_space(**fields, actor=member)
    flash.success(request, f"Space {space.slug} created; you are its owner.")
    return redirect("web-space", slug=space.slug)


def _directory(space: Space, member, after: str) -> tuple[list[Membership], str | None]:
    """One page of the space's members by handle, and the handle the next page starts after."""
    rows = list(visible_memberships(space, member).filter(member__handle__gt=after)
                .order_by("member__handle")[: DIRECTORY_PAGE + 1])
    more = len(rows) > DIRECTORY_PAGE
    rows = rows[:DIRECTORY_PAGE]
    return rows, rows[-1].member.handle if more else None


@member_page
def find_space(request, member):
    """The home page's "find a space" box: the space's page by its slug (a
    malformed slug finds nothing)."""
    slug = request.GET.get("slug", "").strip().lower()
    if not re.fullmatch(SlugConverter.regex, slug):
        raise NotFound("There is no such space.")
    return redirect("web-space", slug=slug)


@member_page
def space_page(request, member, slug):
    space = get_space_for(slug, member)
    if not can_read_space(space, member):
        # A request space shows its metadata to members of the host, who may
        # ask to join it (as GET /v0/spaces/{slug} and its join route do).
        asked = Membership.objects.filter(space=space, member=member, status=Membership.Status.PENDING).exists()
        return render(request, "web/space_request.html", {"space": space, "asked": asked})
    membership = active_membership(space, member)
    start = digits(request.GET.get("from", ""), 9) or 0
    conversations = list(listed_conversations(readable_conversations(space, member))[start:start + LISTED + 1])
    directory, next_after = _directory(space, member, request.GET.get("after", "")[:32])
    return render(request, "web/space.html", {
        "space": space, "membership": membership,
        "is_owner": may_administer(space, member),
        "can_write": may_write(space, membership),
        "conversations": [(c, conversation_label(c, member)) for c in conversations[:LISTED]],
        "next_from": start + LISTED if len(conversations) > LISTED else None,
        "directory": directory, "next_after": next_after, "roles": Membership.Role.values,
    })


def _handle(value: str) -> str:
    value = value.strip()
    return value if value.startswith("@") else f"@{value}"


@member_page
@require_POST
def add_member(request, member, slug):
    """Add a member, admit a join request, or change a role (owners)."""
    space = get_space_for(slug, member)
    other = services.member_to_manage(space, _handle(request.POST.get("member", "")), actor=member)
    change = services.add_member(space, other, role=request.POST.get("role") or None, actor=member)
    verb = "added" if change.created else "is now"
    flash.success(request, f"@{other.handle} {verb} {change.membership.role} of {slug}.")
    return redirect("web-space", slug=slug)


@member_page
@require_POST
def remove_member(request, member, slug, handle):
    space = get_space_for(slug, member)
    other = services.member_to_manage(space, handle, actor=member)
    services.remove_member(space, other, actor=member)
    if other.pk == member.pk:
        flash.success(request, f"You left {slug}.")
        return redirect("web-home")
    flash.success(request, f"@{other.handle} was removed from {slug}.")
    return redirect("web-space", slug=slug)


@member_page
@require_POST
def create_channel(request, member, slug):
    space = get_space_for(slug, member)
    conversation = services.create_channel(space, request.POST.get("name", "").strip(), actor=member)
    return redirect("web-conversation", slug=slug, conversation_id=conversation.public_id)


@member_page
@require_POST
def start_direct(request, member, slug):
    space = get_space_for(slug, member)
    (other,) = services.participants_named(space, [_handle(request.POST.get("member", ""))], actor=member)
    conversation, _ = services.get_or_create_direct(space, other, actor=member)
    return redirect("web-conversation", slug=slug, conversation_id=conversation.public_id)


@member_page
@require_POST
def start_group(request, member, slug):
    """A group of the caller and the listed members, in the order given."""
    space = get_space_for(slug, member)
    handles = [h for h in map(_handle, request.POST.get("members", "").replace(",", " ").split())
               if h != f"@{member.handle}"]
    services.check_group_size(1 + len(handles))  # before looking any of them up
    others = services.participants_named(space, handles, actor=member)
    conversation, _ = services.get_or_create_group(space, [member, *others], actor=member)
    return redirect("web-conversation", slug=slug, conversation_id=conversation.public_id)
