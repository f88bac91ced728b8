"""URLs for tests/controlplane/test_handlers.py and test_tracing.py: views
that say which thread ran them, under which request id."""
import threading

from django.http import JsonResponse, StreamingHttpResponse
from django.urls import path

from controlplane.tracing import current_request_id


def sync_view(request):
    return JsonResponse({"thread": threading.current_thread().name, "request_id": current_request_id()})


async def async_view(request):
    return JsonResponse({"thread": threading.current_thread().name, "request_id": current_request_id()})


def streaming_view(request):
    async def parts():
        yield b"one "
        yield b"two"

    return StreamingHttpResponse(parts(), content_type="text/plain")


urlpatterns = [path("sync", sync_view), path("async", async_view), path("streaming", streaming_view)]
