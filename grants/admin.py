"""Grants and the approval queue in the Django admin. Approval requests are
never edited: an approver reads the whole retained message and approves or
denies it (on the request's page, or as an action on the list)."""
from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from controlplane.access import admin_member
from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import ApiError
from controlplane.models import Member
from grants import approvals, barrier
from grants.models import ApprovalRequest, Grant
from grants.render import render_approval_request


def approver(request) -> Member:
    """The member acting in the admin; approvals need an active admin member."""
    member = admin_member(request.user)
    if member is None:
        raise PermissionDenied("Only active admin members decide approval requests.")
    return member


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    # Recipients are on each request's page (one lookup of handles each); a
    # space by its slug in the search (a filter listed every space of the host).
    list_display = ["public_id", "status", "sender", "space", "conversation", "created_at", "decided_by",
                    "decided_at"]
    list_select_related = ["sender", "space", "conversation", "decided_by"]
    list_filter = ["status"]
    search_fields = ["public_id", "sender__handle", "idempotency_key", "space__slug"]
    ordering = ["-created_at"]
    fields = ["public_id", "status", "space", "conversation", "sender", "recipient_handles", "idempotency_key",
              "retained_body", "reply_to", "related_paths", "collective", "fingerprint", "created_at", "decided_by",
              "decided_at", "reason", "message"]
    readonly_fields = fields
    actions = ["approve_selected", "deny_selected"]
    change_form_template = "admin/grants/approvalrequest/change_form.html"

    @admin.display(description="recipients")
    def recipient_handles(self, obj: ApprovalRequest) -> str:
        return ", ".join(render_approval_request(obj)["recipients"])

    @admin.display(description="body (exactly as it will be sent)")
    def retained_body(self, obj: ApprovalRequest) -> str:
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', obj.body)

    def get_urls(self):
        return [
            path("<path:object_id>/approve/", self.admin_site.admin_view(self.approve_view),
                 name="grants_approvalrequest_approve"),
            path("<path:object_id>/deny/", self.admin_site.admin_view(self.deny_view),
                 name="grants_approvalrequest_deny"),
            *super().get_urls(),
        ]

    def _get(self, request, object_id) -> ApprovalRequest:
        pending = self.get_object(request, object_id)
        if pending is None:
            raise Http404("No such approval request.")
        return pending

    def _decide(self, request, decide, requests) -> int:
        done = 0
        for pending in requests:
            try:
                decide(pending)
                done += 1
            except ApiError as exc:
                self.message_user(request, f"Request {pending.public_id}: {exc.message}", messages.ERROR)
        return done

    def approve_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        actor, pending = approver(request), self._get(request, object_id)
        if self._decide(request, lambda r: approvals.approve(r, actor=actor), [pending]):
            self.message_user(request, f"Approved {pending.public_id}: the message was sent.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:grants_approvalrequest_change", args=[pending.pk]))

    def deny_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        actor, pending = approver(request), self._get(request, object_id)
        reason = request.POST.get("reason", "")
        if self._decide(request, lambda r: approvals.deny(r, reason, actor=actor), [pending]):
            self.message_user(request, f"Denied {pending.public_id}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:grants_approvalrequest_change", args=[pending.pk]))

    @admin.action(description="Approve the selected requests (sends each retained message)")
    def approve_selected(self, request, queryset):
        actor = approver(request)
        done = self._decide(request, lambda r: approvals.approve(r, actor=actor),
                            queryset.filter(status=ApprovalRequest.Status.PENDING).order_by("created_at"))
        self.message_user(request, f"Approved {done} request(s).", messages.SUCCESS)

    @admin.action(description="Deny the selected requests…")
    def deny_selected(self, request, queryset):
        actor = approver(request)
        pending = queryset.filter(status=ApprovalRequest.Status.PENDING).order_by("created_at")
        if "reason" not in request.POST:  # ask for the reason first
            return TemplateResponse(request, "admin/grants/approvalrequest/deny_selected.html", {
                **self.admin_site.each_context(request), "title": "Deny approval requests",
                "requests": pending, "opts": self.model._meta,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            })
        reason = request.POST["reason"]
        done = self._decide(request, lambda r: approvals.deny(r, reason, actor=actor), pending)
        self.message_user(request, f"Denied {done} request(s).", messages.SUCCESS)
        return None


@admin.register(Grant)
class GrantAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "space", "kind", "sender", "recipient", "status", "generation", "expires_at",
                    "created_by", "created_at"]
    list_select_related = ["space", "sender", "recipient", "created_by"]
    list_filter = ["kind", "status"]
    search_fields = ["public_id", "sender__handle", "recipient__handle", "space__slug"]
    actions = ["revoke_selected"]

    @admin.action(description="Revoke the selected grants (runs the revocation barrier)")
    def revoke_selected(self, request, queryset):
        actor = approver(request)
        for grant in queryset.filter(status__in=[Grant.Status.ACTIVE, Grant.Status.REVOKING]):
            barrier.revoke(grant, actor=actor)
        self.message_user(request, "Revoked the selected grants (one with a large backlog stays revoking until "
                                   "a worker finishes its barrier).", messages.SUCCESS)
