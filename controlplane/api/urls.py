from django.urls import path

from controlplane.api import views

urlpatterns = [
    path("me", views.MeView.as_view()),
    path("me/credentials", views.CredentialsView.as_view()),
    path("me/credentials/<str:credential_id>", views.CredentialView.as_view()),
    path("members", views.MembersView.as_view()),
    path("spaces", views.SpacesView.as_view()),
    path("spaces/<str:slug>", views.SpaceView.as_view()),
    path("spaces/<str:slug>/join", views.JoinView.as_view()),
    path("spaces/<str:slug>/members", views.SpaceMembersView.as_view()),
    path("spaces/<str:slug>/members/<str:handle>", views.SpaceMemberView.as_view()),
    path("spaces/<str:slug>/conversations", views.ConversationsView.as_view()),
    path("spaces/<str:slug>/direct", views.DirectView.as_view()),
    path("spaces/<str:slug>/channels", views.ChannelsView.as_view()),
    path("spaces/<str:slug>/groups", views.GroupsView.as_view()),
]
