from django.urls import path

from grants import views

urlpatterns = [
    path("approvals/", views.approval_queue, name="staff-approvals"),
    path("approvals/<pid:request_id>/approve", views.decide, {"decision": "approve"}, name="staff-approve"),
    path("approvals/<pid:request_id>/deny", views.decide, {"decision": "deny"}, name="staff-deny"),
    path("grants/<space:slug>/<grant:grant_id>/revoke", views.revoke, name="staff-grant-revoke"),
]
