"""Spaces, conversations, history and the composer."""
from __future__ import annotations

import secrets

from django.contrib import messages as flash
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane import services as spaces
from controlplane.access import (
    active_membership,
    get_readable_conversation,
    get_space_for,
    readable_conversations_in,
    readable_spaces,
)
from controlplane.api.parsers import parse_json_object
from controlplane.errors import ApiError, GrantRequired, InvalidIdempotencyKey, InvalidRequest, NotFound
from controlplane.idempotency import is_valid_key
from controlplane.models import Conversation, Membership, Space
from coordination.models import TASK_CHANNEL_PREFIX, Task
from inbox import services
from web import messages
from web.pages import digits, may_write, member_page, wants_json


def conversation_label(conversation: Conversation, viewer) -> str:
    """`#name` for a channel, the title for a task's discussion; the other
    members' handles otherwise."""
    if conversation.kind == Conversation.Kind.CHANNEL:
        if conversation.name.startswith(TASK_CHANNEL_PREFIX):
            try:
                return f"Task: {conversation.task.title}"  # no query where the task was selected with it
            except Task.DoesNotExist:
                return f"Task: {conversation.name}"
        return f"#{conversation.name}"
    others = [f"@{p.member.handle}" for p in conversation.participants.all() if p.member_id != viewer.pk]
    return ", ".join(others) or "just you"


OPEN_LISTED = 50  # open spaces one does not belong to, listed by name on the home page
# A space's conversations on the home page: its own page lists them all, a
# page at a time. Others choose how many there are (an owner adds anyone to
# a space of 1,000 channels), so a page must not grow with them.
HOME_LISTED = 20
CONVERSATION_ORDER = ("kind", "name", "created_at", "id")


def listed_conversations(conversations):
    """Conversations as the pages list them: not task discussions (on the
    tasks page), channels first, by name."""
    return (conversations.exclude(kind=Conversation.Kind.CHANNEL, name__startswith=TASK_CHANNEL_PREFIX)
            .prefetch_related("participants__member").order_by(*CONVERSATION_ORDER))


@member_page
def home(request, member):
    """The member's spaces with up to HOME_LISTED of their conversations
    each (in a few queries however many), then up to OPEN_LISTED open
    spaces they may join, by slug: "Find a space" opens any other."""
    roles = dict(Membership.objects.filter(member=member, status=Membership.Status.ACTIVE)
                 .values_list("space_id", "role"))
    mine = list(Space.objects.filter(pk__in=roles).order_by("slug"))
    conversations = {space.pk: [] for space in mine}
    place = Window(RowNumber(), partition_by=F("space_id"), order_by=[F(field).asc() for field in CONVERSATION_ORDER])
    for conversation in listed_conversations(readable_conversations_in(mine, member)).annotate(place=place).filter(
            place__lte=HOME_LISTED + 1):
        conversations[conversation.space_id].append((conversation, conversation_label(conversation, member)))
    others = list(readable_spaces(member).exclude(pk__in=roles).order_by("slug")[: OPEN_LISTED + 1])
    return render(request, "web/home.html", {
        "spaces": [{"space": space, "role": roles[space.pk], "conversations": conversations[space.pk][:HOME_LISTED],
                    "more": len(conversations[space.pk]) > HOME_LISTED} for space in mine],
        "others": others[:OPEN_LISTED], "more_others": len(others) > OPEN_LISTED})


@member_page
@require_POST
def join(request, member, slug):
    change = spaces.join_space(get_space_for(slug, member), actor=member)
    if change.membership.status != Membership.Status.ACTIVE:
        flash.success(request, f"You asked to join {slug}; an owner will admit you.")
    else:
        flash.success(request, f"You joined {slug}." if change.created else f"You are in {slug} already.")
    return redirect("web-home")


def _page_context(member, conversation, before: int | None) -> dict:
    rows, more = messages.before(conversation.pk, before)
    membership = active_membership(conversation.space, member)
    return {
        "conversation": conversation, "space": conversation.space,
        "label": conversation_label(conversation, member),
        "rows": messages.render_rows(conversation.space.send_policy, rows), "more": more,
        "oldest": rows[0].position if rows else None,
        # The live stream starts after the newest message shown; a page of
        # older history (?before=) shows no live stream.
        "after": (rows[-1].position if rows else 0) if before is None else None,
        "can_send": may_write(conversation.space, membership),
        "joinable": membership is None,
    }


def _position_param(request, name: str = "before") -> int | None:
    value = request.GET.get(name)
    if value is None:
        return None
    if (position := digits(value)) is None:
        raise InvalidRequest(f"{name} must be a message position.", details={name: value})
    return position


def _conversation(member, slug: str, conversation_id: str) -> Conversation:
    conversation = get_readable_conversation(member, conversation_id)
    if conversation.space.slug != slug:
        raise NotFound("No such conversation, or you cannot read it.")
    return conversation


@member_page
def conversation_page(request, member, slug, conversation_id):
    conversation = _conversation(member, slug, conversation_id)
    context = _page_context(member, conversation, _position_param(request))
    return render(request, "web/conversation.html", {**context, "draft": "", "idempotency_key": new_key()})


@member_page
def history(request, member, slug, conversation_id):
    """Older messages for the upward pager: {rows, more}. With
    `?withheld_from=` a position, the messages from there on whose bodies
    are withheld instead, for a live page to show as such: {rows}."""
    conversation = _conversation(member, slug, conversation_id)
    send_policy = conversation.space.send_policy
    if (start := _position_param(request, "withheld_from")) is not None:
        rows = messages.withheld_from(conversation.pk, send_policy, start)
        return JsonResponse({"rows": messages.render_rows(send_policy, rows, {row.public_id for row in rows})})
    rows, more = messages.before(conversation.pk, _position_param(request))
    return JsonResponse({"rows": messages.render_rows(send_policy, rows), "more": more})


def new_key() -> str:
    return f"web-{secrets.token_urlsafe(18)}"


def _send_input(request) -> tuple[str, str | None, bool]:
    if request.content_type == "application/json":
        data = parse_json_object(request.body)
        if not isinstance(data.get("body"), str):
            raise InvalidRequest("body is required.")
        body, key, approval = data["body"], data.get("idempotency_key"), data.get("request_approval") is True
    else:
        # Browsers submit a textarea's line breaks as CRLF; the member typed LF.
        body = request.POST.get("body", "").replace("\r\n", "\n")
        key, approval = request.POST.get("idempotency_key"), request.POST.get("request_approval") == "1"
    if key is not None and not is_valid_key(key):
        raise InvalidIdempotencyKey()
    # The body is checked by send_message, as for the API.
    return body, key or None, approval


@member_page
@require_POST
def send(request, member, slug, conversation_id):
    """The composer. Scripts (the page's own) get JSON: the rendered
    message, or the error in the API's shape (GRANT_REQUIRED carries the
    approval request when one was asked for). Without scripts the page is
    rendered again with the error and the draft."""
    body = ""
    try:
        body, key, approval = _send_input(request)
        result = services.send_to(slug, conversation_id, body=body, idempotency_key=key, request_approval=approval,
                                  actor=member)
    except ApiError as error:
        if wants_json(request):
            raise
        context = _page_context(member, _conversation(member, slug, conversation_id), None)
        retained = isinstance(error, GrantRequired) and "approval_request" in error.details
        # A message kept for approval is done with: a fresh draft and key.
        return render(request, "web/conversation.html",
                      {**context, "error": error, "approval_requested": retained,
                       "draft": "" if retained else body,
                       "idempotency_key": new_key() if retained else request.POST.get("idempotency_key") or new_key()},
                      status=error.status)
    if wants_json(request):
        row = messages.render_rows(result.message.space.send_policy, [result.message])[0]
        return JsonResponse({"message": row}, status=201 if result.created else 200)
    return redirect("web-conversation", slug=slug, conversation_id=conversation_id)
