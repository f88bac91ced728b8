"""Bearer credentials for API clients; Django sessions (with CSRF) for the web app.

Both authenticate a `Member`, which becomes `request.user`."""
from __future__ import annotations

from django.db import connection
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed

from controlplane.db import model_columns, model_from_row
from controlplane.errors import Unauthenticated
from controlplane.models import Credential, Member
from controlplane.tokens import TOKEN_RE, hash_token


# The challenge of a 401 on every surface that takes bearer credentials.
WWW_AUTHENTICATE = 'Bearer realm="switchboard"'


def _credential_sql() -> str:
    # Every column of the member: a field left out would be loaded by a
    # query of its own when first read (GET /v0/me renders `created_at`).
    quote = connection.ops.quote_name
    return (f"SELECT c.id, c.public_id, {model_columns(Member, 'm')} FROM {quote(Credential._meta.db_table)} c "
            f"JOIN {quote(Member._meta.db_table)} m ON m.id = c.member_id WHERE c.token_hash = %s")


def credential_for_hash(token_hash: str) -> Credential | None:
    """The credential and its member in one query. Plain SQL: this runs on
    every API request, and compiling the ORM join cost more than running it."""
    with connection.cursor() as cursor:
        cursor.execute(_credential_sql(), [token_hash])
        row = cursor.fetchone()
    if row is None:
        return None
    member = model_from_row(Member, row[2:])
    credential = Credential.from_db(connection.alias, ["id", "public_id", "member_id"], [row[0], row[1], member.pk])
    credential.member = member
    return credential


def credential_for_bearer(header: str) -> Credential:
    """The credential an `Authorization: Bearer sbt_…` header names, with
    its member, who must be active: 401 UNAUTHENTICATED otherwise. Every
    surface that takes bearer credentials (the API, /mcp) asks here."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not TOKEN_RE.fullmatch(token):
        raise Unauthenticated("Use Authorization: Bearer sbt_….")
    credential = credential_for_hash(hash_token(token))
    if credential is None or not credential.member.is_active:
        raise Unauthenticated("The credential is unknown, revoked, or its member is suspended.")
    return credential


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        try:
            credential = credential_for_bearer(header)
        except Unauthenticated as exc:
            raise AuthenticationFailed(exc.message) from None
        return credential.member, credential

    def authenticate_header(self, request):
        return WWW_AUTHENTICATE


class MemberSessionAuthentication(SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        member = getattr(result[0], "member", None)
        if member is None or not member.is_active:
            return None
        return member, None
