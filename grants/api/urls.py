from django.urls import path

from grants.api import views

urlpatterns = [
    path("spaces/<space:slug>/grants", views.SpaceGrantsView.as_view()),
    path("spaces/<space:slug>/grants/<grant:grant_id>", views.SpaceGrantView.as_view()),
    path("spaces/<space:slug>/grants/<grant:grant_id>/revoke", views.RevokeSpaceGrantView.as_view()),
    path("grants/<grant:grant_id>", views.GrantView.as_view()),
    path("grants/<grant:grant_id>/revoke", views.RevokeGrantView.as_view()),
    path("approval-requests", views.ApprovalRequestsView.as_view()),
    path("approval-requests/<pid:request_id>", views.ApprovalRequestView.as_view()),
    path("approval-requests/<pid:request_id>/approve", views.ApproveView.as_view()),
    path("approval-requests/<pid:request_id>/deny", views.DenyView.as_view()),
]
