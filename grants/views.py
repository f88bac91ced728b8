"""The staff approval queue: every pending request with its whole retained
message, approved or denied (with a reason) from one page."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.errors import ApiError
from grants import approvals
from grants.admin import approver
from grants.models import ApprovalRequest
from grants.render import render_approval_request

QUEUE_PAGE = 100


@staff_member_required
def approval_queue(request):
    approver(request)  # an active admin member, not only a staff user
    pending = list(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
                   .select_related("space", "conversation", "sender").order_by("created_at")[:QUEUE_PAGE])
    decided = list(ApprovalRequest.objects.exclude(status=ApprovalRequest.Status.PENDING)
                   .select_related("sender", "decided_by", "message").order_by("-decided_at")[:20])
    return render(request, "staff/approvals.html", {
        "pending": [(r, render_approval_request(r)) for r in pending], "decided": decided,
    })


@staff_member_required
@require_POST
def decide(request, request_id: str, decision: str):
    actor = approver(request)
    pending = get_object_or_404(ApprovalRequest, public_id=request_id)
    try:
        if decision == "approve":
            approvals.approve(pending, actor=actor)
            messages.success(request, f"Approved {pending.public_id}: the message was sent.")
        else:
            approvals.deny(pending, request.POST.get("reason", ""), actor=actor)
            messages.success(request, f"Denied {pending.public_id}.")
    except ApiError as exc:
        messages.error(request, f"{pending.public_id}: {exc.message}")
    return redirect("staff-approvals")
