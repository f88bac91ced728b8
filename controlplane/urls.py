from importlib import import_module

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView

from controlplane.health import readiness
from web.errors import unknown_route


def healthz(request):
    """Liveness: the process answers. Touches nothing (PROBE_PATHS)."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """Readiness: the database and Redis answer (controlplane.health)."""
    ready, report = readiness()
    return JsonResponse(report, status=200 if ready else 503, headers={"Cache-Control": "no-store"})


def schema_view(module: str, name: str, **initkwargs):
    """The schema's view `name` of `module`, imported at its first request:
    drf-spectacular's views load the schema generator
    (controlplane.api.openapi)."""
    view = None

    def dispatch(request, *args, **kwargs):
        nonlocal view
        if view is None:
            view = getattr(import_module(module), name).as_view(**initkwargs)
        return view(request, *args, **kwargs)

    dispatch.csrf_exempt = True  # as every API view is
    return dispatch


urlpatterns = [
    path("healthz", healthz),
    path("readyz", readyz),
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/app/", permanent=False)),
    path("app/", include("web.urls")),
    path("staff/", include("grants.urls")),
    path("v0/schema/", schema_view("controlplane.api.schema_view", "SchemaView"), name="schema"),
    path("v0/docs/", schema_view("drf_spectacular.views", "SpectacularSwaggerView", url_name="schema"), name="docs"),
    path("v0/", include("controlplane.api.urls")),
    path("v0/", include("inbox.api.urls")),
    path("v0/", include("grants.api.urls")),
    path("v0/", include("coordination.api.urls")),
    path("v0/", include("webhooks.api.urls")),
    # Unknown routes answer in the error shape, in DEBUG too (Django's debug
    # 404 page would be HTML and list every route); writes too, before the
    # CSRF check refuses them (a bearer write to a mistyped path was a 403).
    re_path(r"", csrf_exempt(unknown_route)),
]

handler400 = "controlplane.errors.bad_request"
handler403 = "controlplane.errors.permission_denied"
handler404 = "web.errors.not_found"
handler500 = "controlplane.errors.server_error"
