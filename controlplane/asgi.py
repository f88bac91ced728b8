"""ASGI entry point: HTTP (Django, with static files) and WebSockets (Channels)."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

application = ProtocolTypeRouter({
    "http": ASGIStaticFilesHandler(django_application),
})
