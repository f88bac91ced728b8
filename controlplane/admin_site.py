"""The admin site (installed by controlplane.apps.SwitchboardAdminConfig)."""
from __future__ import annotations

from django.contrib import admin
from django.utils.decorators import method_decorator

from controlplane.access import admin_member
from controlplane.ratelimit import throttle_signin


class SwitchboardAdminSite(admin.AdminSite):
    """The admin is for active admin members only: a suspended or demoted
    admin's session stops opening it at once (Django's own check reads the
    user's flags, which `update_member` keeps in step, but the member is the
    authority)."""

    @method_decorator(throttle_signin)
    def login(self, request, extra_context=None):
        return super().login(request, extra_context)

    def has_permission(self, request):
        return super().has_permission(request) and admin_member(request.user) is not None
