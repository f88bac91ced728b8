from rest_framework.permissions import SAFE_METHODS, BasePermission


class IsMember(BasePermission):
    """An authenticated, active member (anonymous callers get 401)."""

    def has_permission(self, request, view):
        return request.user is not None


class IsAdmin(BasePermission):
    def has_permission(self, request, view):
        return request.user is not None and request.user.is_admin


class ReadableAnonymously(BasePermission):
    """Reads are open to anonymous callers (the view still checks the space);
    writes need a member."""

    def has_permission(self, request, view):
        return request.method in SAFE_METHODS or request.user is not None
