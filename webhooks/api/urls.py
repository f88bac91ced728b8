from django.urls import path

from webhooks.api import views

urlpatterns = [
    path("webhook-endpoints", views.EndpointsView.as_view()),
    path("webhook-endpoints/<pid:endpoint_id>", views.EndpointView.as_view()),
    path("webhook-endpoints/<pid:endpoint_id>/verify", views.VerifyEndpointView.as_view()),
    path("spaces/<space:slug>/webhook-subscriptions", views.SpaceSubscriptionsView.as_view()),
    path("spaces/<space:slug>/webhook-subscriptions/<pid:subscription_id>", views.SpaceSubscriptionView.as_view()),
    path("spaces/<space:slug>/webhook-subscriptions/<pid:subscription_id>/activate",
         views.SpaceActivateView.as_view()),
    path("me/inbox-subscriptions", views.InboxSubscriptionsView.as_view()),
    path("me/inbox-subscriptions/<pid:subscription_id>", views.InboxSubscriptionView.as_view()),
    path("me/inbox-subscriptions/<pid:subscription_id>/activate", views.InboxActivateView.as_view()),
    path("webhook-subscriptions/<pid:subscription_id>/deliveries", views.DeliveriesView.as_view()),
    path("webhook-deliveries/<pid:delivery_id>/replay", views.ReplayView.as_view()),
    path("webhook-signing-keys", views.SigningKeysView.as_view()),
]
