"""WebSocket guards: the handshake's origin, and the session behind a socket."""
from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier

from controlplane.middleware import host_check


class SameOriginOnly:
    """Refuse a socket opened by another site's page, or on a host this
    server does not serve.

    Browsers send `Origin` on every WebSocket handshake, with the site's
    cookies, so a foreign page could otherwise read a member's live streams.
    The socket's Host and its Origin must pass the HTTP requests' own check
    (ALLOWED_HOSTS: controlplane.middleware.host_check, as `/mcp`'s), and
    the origin must be the host the socket was opened on. Clients that send
    no Origin (scripts, not browsers) pass that part; they need a session
    cookie of their own."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        if host_check(headers) is not None or (origin is not None and urlsplit(
                origin.decode("latin-1")).netloc != headers.get(b"host", b"").decode("latin-1")):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def session_group(session_key: str) -> str:
    """The Channels group of one session's sockets. Named by a digest: a
    session key is a credential and stays out of the channel layer."""
    return "web.session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def end_live_sockets(sender, request, user, **kwargs) -> None:
    """On sign-out, close that session's sockets (every process, with Redis)."""
    from controlplane.live import group_send_on_commit

    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None)
    if key:
        session.signed_out = True  # its deletion, next, tells the sockets nothing more (reconnect_live_sockets)
        group_send_on_commit(session_group(key), {"type": "session.ended"})


def reconnect_live_sockets(sender, session_key, store=None, **kwargs) -> None:
    """A session deleted (controlplane.sessions.session_deleted): signing
    in again, as the same member or someone else, replaced its key. Its
    sockets close to reconnect (1011), and each handshake decides on the
    session the browser holds now; they went on as the old session's
    member until the hour's renewal. Signing out told them already (4401):
    a second message could overtake the first on Redis, and a page told to
    reconnect after signing out came back anonymous."""
    from controlplane.live import group_send_on_commit

    if getattr(store, "signed_out", False):
        return
    group_send_on_commit(session_group(session_key), {"type": "session.changed"})


# What a sign-in rests on besides the session: a new password ends every
# other session (Django's session hash), and so does an inactive user.
SESSION_FIELDS = ("password", "is_active")


def note_session_change(sender, instance, update_fields=None, **kwargs) -> None:
    """pre_save of a user: remember whether what their sessions rest on changes."""
    if instance.pk is None or (update_fields is not None and not set(SESSION_FIELDS) & set(update_fields)):
        return
    before = type(instance).objects.filter(pk=instance.pk).values_list(*SESSION_FIELDS).first()
    instance._sessions_changed = before is not None and before != tuple(getattr(instance, f) for f in SESSION_FIELDS)


def recheck_live_sockets(sender, instance, **kwargs) -> None:
    """post_save of a user whose password or active flag changed: every
    socket of theirs closes to reconnect (1011), and each handshake then
    decides again, so one of a session the change ended is signed out."""
    if not getattr(instance, "_sessions_changed", False):
        return
    from controlplane.live import group_send_on_commit, member_group
    from controlplane.models import Member

    instance._sessions_changed = False
    if (member := Member.objects.filter(user_id=instance.pk).first()) is not None:
        group_send_on_commit(member_group(member), {"type": "session.changed"})


def signed_in_user_id(session_key: str) -> int | None:
    """The id of the user the session signs in now, as a request with it
    would find (Django's `get_user`: unexpired, its user active, its hash
    the user's), else None."""
    from importlib import import_module
    from types import SimpleNamespace

    from django.conf import settings
    from django.contrib.auth import get_user

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    user = get_user(SimpleNamespace(session=store))
    return user.pk if user.is_authenticated else None
