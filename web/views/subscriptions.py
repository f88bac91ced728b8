"""Receivers (webhook endpoints) and subscriptions for the signed-in member.

Every action goes through webhooks.services, as the API does, and answers
with the page again and a message saying what happened. Secrets are taken
once and never shown: the page says only whether an endpoint has one."""
from __future__ import annotations

import functools
from urllib.parse import parse_qs, urlsplit

from django.contrib import messages as flash
from django.db.models import F, Prefetch, Window
from django.db.models.functions import RowNumber
from django.http import HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from controlplane.access import (get_readable_space, own_space_ids, readable_conversation,
                                 readable_conversations_in, readable_spaces)
from controlplane.models import Space
from controlplane.errors import ApiError, InvalidRequest, NotFound
from web.pages import member_page, wants_json
from web.views.conversations import conversation_label
from webhooks import services, verification
from webhooks.models import Attempt, Endpoint, Subscription

RECENT_DELIVERIES = 5


def _subscription_rows(member) -> list[dict]:
    """Each subscription with what it follows and its recent deliveries, in
    a few queries however many subscriptions and subjects there are (the
    page reloads itself every two seconds while it is open)."""
    subscriptions = list(Subscription.objects.filter(owner=member).exclude(status=Subscription.Status.DELETED)
                         .select_related("endpoint", "space").order_by("created_at"))
    recent = {}
    deliveries = (services.deliveries_of(*subscriptions)
                  .annotate(newest=Window(RowNumber(), partition_by=[F("subscription_id")],
                                          order_by=[F("created_at").desc(), F("id").desc()]))
                  .filter(newest__lte=RECENT_DELIVERIES).order_by("subscription_id", "newest")
                  .prefetch_related(Prefetch("attempt_rows", queryset=Attempt.objects.order_by("number"))))
    for delivery in deliveries:
        recent.setdefault(delivery.subscription_id, []).append(delivery)
    labels = _subject_labels(member, subscriptions)
    return [{"subscription": s, "target": _target_label(s, labels), "deliveries": recent.get(s.pk, [])}
            for s in subscriptions]


def _subject_labels(member, subscriptions: list[Subscription]) -> dict[int, str]:
    """The label of every subject conversation `member` may still read, by pk."""
    pks = {pk for s in subscriptions for pk in s.conversation_ids or ()}
    readable = (readable_conversations_in(readable_spaces(member), member).filter(pk__in=pks)
                .select_related("task").prefetch_related("participants__member"))
    return {c.pk: conversation_label(c, member) for c in readable}


def _target_label(subscription: Subscription, labels: dict[int, str]) -> str:
    if subscription.kind == Subscription.Kind.INBOX:
        return "Your inbox"
    if subscription.kind == Subscription.Kind.ITEM:
        return "Your inbox items, pushed"
    if subscription.conversation_ids:
        names = [labels[pk] for pk in subscription.conversation_ids if pk in labels]
        return f"{', '.join(names) or 'conversations'} in {subscription.space.slug}"
    return f"All messages in {subscription.space.slug}"


@member_page
def subscriptions_page(request, member):
    return _page(request, member, request.get_full_path())


def _page(request, member, here: str, error: ApiError | None = None):
    """The page at `here` (its own URL, which its forms come back to); after
    a refused action, with the refusal and its reason above the forms and
    what was typed in them (the secret aside), under the refusal's status."""
    # An MCP subscription's endpoint is shown while the subscription is (it
    # stays a day after an unsubscribe, webhooks.mcp.reap_deleted).
    endpoints = list(Endpoint.objects.owned_by(member).exclude(managed=True, subscriptions__status="deleted")
                     .order_by("created_at"))
    conversation = None
    if ref := parse_qs(urlsplit(here).query).get("conversation"):
        conversation = readable_conversation(member, ref[0])
    return render(request, "web/subscriptions.html", status=error.status if error else 200, context={
        "here": here, "error": error,
        "typed": {name: value for name, value in request.POST.items() if name != "secret"} if error else {},
        "endpoints": [(e, services.is_verified(e)) for e in endpoints],
        "receivers": [(e, services.is_verified(e)) for e in endpoints if not e.managed],  # may take a subscription
        "subscriptions": _subscription_rows(member),
        # The member's own spaces: any other readable space is named by its slug
        # (every open space of the host would make one list without end).
        "spaces": list(Space.objects.filter(id__in=own_space_ids(member)).order_by("slug")),
        "conversation": conversation,
        "conversation_label": conversation_label(conversation, member) if conversation else "",
    })


def _next(request) -> str | None:
    """The page the form was on (this site's pages only)."""
    target = request.POST.get("next", "")
    if target.startswith("/") and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return None


def _back(request):
    target = _next(request)
    return HttpResponseRedirect(target) if target else redirect("web-subscriptions")


def on_the_page(view):
    """A refused action answers with the subscriptions page again: its own
    error page named no reason (a verification's `http_500`, `dns_error`)
    and led only home, losing what was typed. Scripts and htmx get
    member_page's answer."""
    @functools.wraps(view)
    def wrapper(request, member, *args, **kwargs):
        try:
            return view(request, member, *args, **kwargs)
        except ApiError as error:
            if wants_json(request) or request.headers.get("HX-Request"):
                raise
            page, target = reverse("web-subscriptions"), _next(request) or ""
            return _page(request, member, target if target.startswith(page) else page, error)
    return wrapper


@sensitive_post_parameters("secret")
@member_page
@require_POST
@on_the_page
def create_endpoint(request, member):
    secret = request.POST.get("secret", "").strip() or None
    endpoint = services.create_endpoint(member, request.POST.get("url", "").strip(), secret, actor=member)
    flash.success(request, f"Receiver {endpoint.url} saved. Verify it next.")
    return _back(request)


@member_page
@require_POST
@on_the_page
def endpoint_action(request, member, endpoint_id, action):
    endpoint = services.owned_endpoint(endpoint_id, member)
    if action == "verify":
        verification.verify_endpoint(endpoint)
        flash.success(request, f"{endpoint.url} answered the signed challenge: verified.")
    else:
        services.delete_endpoint(endpoint)
        flash.success(request, f"Receiver {endpoint.url} and its subscriptions were deleted.")
    return _back(request)


def _target(member, value: str, slug: str = "") -> dict:
    """`inbox`, `space:SLUG` or `conversation:CNV` as create_subscription's
    arguments; a space named by `slug` (any the member may read) instead."""
    kind, _, ref = ("space", None, slug) if slug else value.partition(":")
    if kind == "inbox" and not ref:
        return {}
    if kind == "space":
        return {"space": get_readable_space(ref, member)}
    if kind == "conversation":
        conversation = readable_conversation(member, ref)
        if conversation is not None:
            return {"space": conversation.space, "subjects": [{"type": "conversation", "id": ref}]}
    raise InvalidRequest("Choose what to subscribe to.", details={"target": value})


@member_page
@require_POST
@on_the_page
def create_subscription(request, member):
    activate = request.POST.get("activate") == "1"
    subscription = services.create_subscription(member, request.POST.get("endpoint", ""), activate=activate,
                                                **_target(member, request.POST.get("target", ""),
                                                                  request.POST.get("space", "").strip()))
    target = _target_label(subscription, _subject_labels(member, [subscription]))
    flash.success(request, f"Subscribed and active: {target}." if activate
                  else f"Subscription created (inactive): {target}.")
    return _back(request)


@member_page
@require_POST
@on_the_page
def subscription_action(request, member, subscription_id, action):
    if action not in {"activate", "pause", "resume", "delete"}:
        raise NotFound()
    subscription = services.owned_subscription(subscription_id, member)
    if action == "activate":
        services.activate(subscription)
    elif action == "pause":
        services.update_subscription(subscription, status=Subscription.Status.PAUSED, debounce_ms=None)
    elif action == "resume":
        services.update_subscription(subscription, status=Subscription.Status.ACTIVE, debounce_ms=None)
    else:
        services.delete_subscription(subscription)
        flash.success(request, "Subscription deleted; unsent wakes were cancelled.")
        return _back(request)
    target = _target_label(subscription, _subject_labels(member, [subscription]))
    flash.success(request, f"{target}: subscription {subscription.status}.")
    return _back(request)
