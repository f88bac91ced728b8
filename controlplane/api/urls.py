from django.urls import path

from controlplane.api import views

urlpatterns = [
    path("me", views.MeView.as_view()),
    path("me/credentials", views.CredentialsView.as_view()),
    path("me/credentials/<pid:credential_id>", views.CredentialView.as_view()),
    path("me/spaces", views.MySpacesView.as_view()),
    path("members", views.MembersView.as_view()),
    path("spaces", views.SpacesView.as_view()),
    path("spaces/<space:slug>", views.SpaceView.as_view()),
    path("spaces/<space:slug>/join", views.JoinView.as_view()),
    path("spaces/<space:slug>/members", views.SpaceMembersView.as_view()),
    path("spaces/<space:slug>/members/<handle:handle>", views.SpaceMemberView.as_view()),
    path("spaces/<space:slug>/conversations", views.ConversationsView.as_view()),
    path("spaces/<space:slug>/direct", views.DirectView.as_view()),
    path("spaces/<space:slug>/channels", views.ChannelsView.as_view()),
    path("spaces/<space:slug>/groups", views.GroupsView.as_view()),
]
