from django.urls import path

from web import consumers

websocket_urlpatterns = [
    path("ws/conversations/<pid:conversation>/", consumers.ConversationConsumer.as_asgi()),
    path("ws/inbox/", consumers.InboxConsumer.as_asgi()),
]
