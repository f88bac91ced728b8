from django.urls import path

from inbox.api import delivery_views, views
from inbox.api.longpoll import long_polling

urlpatterns = [
    path("spaces/<space:slug>/conversations/<conversation:conversation>/messages", views.SendMessageView.as_view()),
    path("spaces/<space:slug>/events", long_polling(views.SpaceEventsView.as_view())),
    path("me/inbox/events", long_polling(views.InboxEventsView.as_view())),
    path("me/snapshot", views.SnapshotView.as_view()),
    path("me/inbox", delivery_views.InboxView.as_view()),
    path("me/inbox/acknowledge", delivery_views.AcknowledgeDeliveryView.as_view()),
    path("me/inbox/firewall", delivery_views.FirewallView.as_view()),
    path("me/inbox/held", delivery_views.HeldView.as_view()),
    path("me/inbox/held/release", delivery_views.ReleaseView.as_view()),
    path("inbox-events/<str:event_id>", delivery_views.InboxEventView.as_view()),
    path("messages/<pid:message_id>", views.MessageView.as_view()),
    path("messages/<pid:message_id>/body", views.MessageBodyView.as_view()),
    path("messages/<pid:message_id>/acknowledge", views.AcknowledgeView.as_view()),
    path("messages/<pid:message_id>/resolve", views.ResolveView.as_view()),
    path("messages/<pid:message_id>/answer", views.AnswerView.as_view()),
    path("messages/<pid:message_id>/answers", views.AnswersView.as_view()),
]
