"""Bearer credentials for API clients; Django sessions (with CSRF) for the web app.

Both authenticate a `Member`, which becomes `request.user`.

With Redis, each process remembers the bearer lookups it made for
CREDENTIAL_CACHE_SECONDS, under the *epoch* they were read in: a value in
Redis that every change of a member or a credential sets anew when it
commits (and that drops this process's lookups at once). A request reads
the epoch in the round trip that counts it against its rate limit, so a
remembered lookup is used only while nothing has changed since it was
made: a suspension or a revocation holds on every process from the moment
its request answers, as when every request asked the database."""
from __future__ import annotations

import secrets
import time
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed

from controlplane.cache import raw_redis
from controlplane.db import model_columns, model_from_row
from controlplane.errors import WWW_AUTHENTICATE, Unauthenticated
from controlplane.live import credential_group, group_send_on_commit
from controlplane.models import Credential, Member
from controlplane.ratelimit import member_request_wait, member_request_wait_reading
from controlplane.tokens import TOKEN_RE, hash_token



def _credential_sql() -> str:
    # Every column of the member: a field left out would be loaded by a
    # query of its own when first read (GET /v0/me renders `created_at`).
    quote = connection.ops.quote_name
    return (f"SELECT c.id, c.public_id, {model_columns(Member, 'm')} FROM {quote(Credential._meta.db_table)} c "
            f"JOIN {quote(Member._meta.db_table)} m ON m.id = c.member_id WHERE c.token_hash = %s")


def _credential_row(token_hash: str) -> tuple | None:
    """The credential and its member in one query. Plain SQL: this runs on
    every API request the cache cannot answer, and compiling the ORM join
    cost more than running it."""
    with connection.cursor() as cursor:
        cursor.execute(_credential_sql(), [token_hash])
        return cursor.fetchone()


def _credential(row: tuple) -> Credential:
    """New instances for each request: a remembered row is shared, what is
    built from it is not."""
    member = model_from_row(Member, row[2:])
    credential = Credential.from_db(connection.alias, ["id", "public_id", "member_id"], [row[0], row[1], member.pk])
    credential.member = member
    return credential


class _Remembered(NamedTuple):
    row: tuple
    member_public_id: str
    epoch: bytes | None
    until: float  # _clock()


_remembered: dict[str, _Remembered] = {}
_clock = time.monotonic
MAX_REMEMBERED = 10_000  # valid credentials only: at most 20 a member
EPOCH = "credentials:epoch"


def _epoch_key():
    """The Redis client and the epoch's key; None without Redis or with
    the cache turned off (CREDENTIAL_CACHE_SECONDS = 0)."""
    if settings.CREDENTIAL_CACHE_SECONDS <= 0:
        return None
    return raw_redis(EPOCH)


def forget_credentials() -> None:
    """A member or a credential changed: this process drops what it
    remembers now, every process when the change commits."""
    if (redis := _epoch_key()) is None:
        return
    _remembered.clear()
    client, key = redis
    transaction.on_commit(lambda: client.set(key, secrets.token_hex(8)))


def _changed(sender, instance, created=False, **kwargs):
    if not created:  # a new member or credential is in no one's cache
        forget_credentials()


def _revoked(sender, instance, **kwargs):
    """What a credential opened and holds open (MCP streams) ends once its
    deletion commits."""
    group_send_on_commit(credential_group(instance.public_id), {"type": "credential.revoked"})


def watch_changes() -> None:
    """Every save or delete of a member or a credential, through the ORM
    (the services, the admin), moves the epoch, and a credential's deletion
    ends its streams: connected at startup."""
    for model in (Member, Credential):
        post_save.connect(_changed, sender=model, dispatch_uid=f"forget-credentials-saved-{model.__name__}")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"forget-credentials-deleted-{model.__name__}")
    post_delete.connect(_revoked, sender=Credential, dispatch_uid="end-streams-of-deleted-credentials")


_UNCOUNTED = object()


def authenticate_bearer(header: str, *, count: bool = True) -> tuple[Credential, float | None]:
    """The credential an `Authorization: Bearer sbt_…` header names, with
    its member, who must be active (401 UNAUTHENTICATED otherwise), and,
    with `count`, the request counted against the member's rate limit: the
    seconds to wait, or None. Every surface that takes bearer credentials
    (the API, /mcp) asks here."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not TOKEN_RE.fullmatch(token):
        raise Unauthenticated("Use Authorization: Bearer sbt_….")
    token_hash = hash_token(token)
    wait, redis = _UNCOUNTED, _epoch_key()
    row = epoch = None
    if redis is not None:
        client, key = redis
        entry = _remembered.get(token_hash)
        if entry is not None and entry.until > _clock():
            if count:
                wait, epoch = member_request_wait_reading(entry.member_public_id, key)
            else:
                epoch = client.get(key)
            if epoch == entry.epoch:
                row = entry.row
        else:
            epoch = client.get(key)  # before the read: a change after it moves the epoch past this one
    remember = row is None and redis is not None
    if row is None:
        row = _credential_row(token_hash)
    credential = _credential(row) if row is not None else None
    if remember:
        _remembered.pop(token_hash, None)
        if credential is not None:
            if len(_remembered) >= MAX_REMEMBERED:
                _remembered.clear()
            _remembered[token_hash] = _Remembered(row, credential.member.public_id, epoch,
                                                  _clock() + settings.CREDENTIAL_CACHE_SECONDS)
    if credential is None or not credential.member.is_active:
        raise Unauthenticated("The credential is unknown, revoked, or its member is suspended.")
    if wait is _UNCOUNTED:
        wait = member_request_wait(credential.member) if count else None
    return credential, wait


class BearerTokenAuthentication(BaseAuthentication):
    """Also counts the request against the member's rate limit, in the
    round trip that checks the credential cache's epoch; the throttle
    (`MemberRateThrottle`) takes the verdict from here."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        django_request = request._request
        try:
            # A long-poll re-reading its feed is one request, counted once.
            credential, wait = authenticate_bearer(
                header, count=not getattr(django_request, "switchboard_repoll", False))
        except Unauthenticated as exc:
            raise AuthenticationFailed(exc.message) from None
        django_request.switchboard_rate_wait = wait
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
