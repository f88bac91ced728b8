"""Bearer credentials for API clients; Django sessions (with CSRF) for the web app.

Both authenticate a `Member`, which becomes `request.user`."""
from __future__ import annotations

from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed

from controlplane.models import Credential
from controlplane.tokens import TOKEN_RE, hash_token


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not TOKEN_RE.fullmatch(token):
            raise AuthenticationFailed("Use Authorization: Bearer sbt_….")
        credential = Credential.objects.select_related("member").filter(token_hash=hash_token(token)).first()
        if credential is None or not credential.member.is_active:
            raise AuthenticationFailed("The credential is unknown, revoked, or its member is suspended.")
        return credential.member, credential

    def authenticate_header(self, request):
        return 'Bearer realm="switchboard"'


class MemberSessionAuthentication(SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        member = getattr(result[0], "member", None)
        if member is None or not member.is_active:
            return None
        return member, None
