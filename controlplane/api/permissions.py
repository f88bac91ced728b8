from rest_framework.permissions import SAFE_METHODS, BasePermission

from controlplane.access import is_active_admin


class IsMember(BasePermission):
    """An authenticated, active member (anonymous callers get 401)."""

    def has_permission(self, request, view):
        return request.user is not None


class IsAdmin(BasePermission):
    def has_permission(self, request, view):
        return is_active_admin(request.user)


class ReadableAnonymously(BasePermission):
    """Reads are open to anonymous callers (the view still checks the space);
    writes need a member."""

    def has_permission(self, request, view):
        return request.method in SAFE_METHODS or request.user is not None
