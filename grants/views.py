"""The staff approval queue: every pending request with its whole retained
message, approved or denied (with a reason) from one page; and the grants in
force, each revocable there (through the same revocation barrier as the
API's)."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from controlplane.api.parsers import check_text
from controlplane.errors import ApiError
from grants import approvals, services
from grants.admin import approver
from grants.models import ApprovalRequest, Grant
from grants.render import render_approval_requests

QUEUE_PAGE = 100


@never_cache  # message bodies awaiting a decision
@staff_member_required
def approval_queue(request):
    approver(request)  # an active admin member, not only a staff user
    return _queue(request)


def _queue(request, status: int = 200):
    waiting = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    pending = list(waiting.select_related("space", "conversation", "sender").order_by("created_at")[:QUEUE_PAGE])
    decided = list(ApprovalRequest.objects.exclude(status=ApprovalRequest.Status.PENDING)
                   .select_related("sender", "decided_by", "message").order_by("-decided_at")[:20])
    in_force = Grant.objects.filter(status__in=[Grant.Status.ACTIVE, Grant.Status.REVOKING])
    grants = list(in_force.select_related("space", "sender", "recipient", "message").order_by("-created_at")
                  [:QUEUE_PAGE])
    # The page shows one screenful of each; past it, it says how many more
    # there are, and the admin site's lists (filtered, searchable) have them all.
    return render(request, "staff/approvals.html", {
        "pending": list(zip(pending, render_approval_requests(pending))), "decided": decided, "grants": grants,
        "pending_total": waiting.count() if len(pending) == QUEUE_PAGE else len(pending),
        "grants_total": in_force.count() if len(grants) == QUEUE_PAGE else len(grants),
    }, status=status)


def _refused(request, subject: str, error: ApiError):
    """The queue again, the refusal at its top, with the status and code the
    API would give (it was a redirect: a 302 for bad input)."""
    messages.error(request, f"{subject}: {error.message} ({error.code})")
    response = _queue(request, status=error.status)
    add_never_cache_headers(response)
    return response


@staff_member_required
@require_POST
def revoke(request, slug: str, grant_id: str):
    actor = approver(request)
    grant = get_object_or_404(Grant, space__slug=slug, public_id=grant_id)  # an id is unique within its space
    try:
        grant = services.revoke_grant(grant, actor=actor)
    except ApiError as exc:
        return _refused(request, f"Grant {grant.public_id}", exc)
    messages.success(request, f"Grant {grant.public_id} is {grant.status}.")
    return redirect("staff-approvals")


@staff_member_required
@require_POST
def decide(request, request_id: str, decision: str):
    actor = approver(request)
    pending = get_object_or_404(ApprovalRequest, public_id=request_id)
    try:
        check_text({"form": dict(request.POST.lists())})  # storable text only, as on every page
        if decision == "approve":
            approvals.approve(pending, actor=actor)
        else:
            approvals.deny(pending, request.POST.get("reason", ""), actor=actor)
    except ApiError as exc:
        return _refused(request, f"Request {pending.public_id}", exc)
    messages.success(request, f"Approved {pending.public_id}: the message was sent." if decision == "approve"
                     else f"Denied {pending.public_id}.")
    return redirect("staff-approvals")
