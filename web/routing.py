from channels.security.websocket import WebsocketDenier
from django.urls import path, re_path

from web import consumers

websocket_urlpatterns = [
    path("ws/conversations/<pid:conversation>/", consumers.ConversationConsumer.as_asgi()),
    path("ws/inbox/", consumers.InboxConsumer.as_asgi()),
    # Any other path is refused at the handshake (403), not a 500 with a
    # traceback in the log for every anonymous try.
    re_path(r"", WebsocketDenier.as_asgi()),
]
