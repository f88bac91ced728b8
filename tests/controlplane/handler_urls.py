"""URLs for tests/controlplane/test_handlers.py: views that say which thread ran them."""
import threading

from django.http import JsonResponse
from django.urls import path


def sync_view(request):
    return JsonResponse({"thread": threading.current_thread().name})


async def async_view(request):
    return JsonResponse({"thread": threading.current_thread().name})


urlpatterns = [path("sync", sync_view), path("async", async_view)]
