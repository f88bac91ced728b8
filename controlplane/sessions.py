"""The session engine (SESSION_ENGINE): Django's database sessions, each
row naming the user it signs in, as Django's documentation extends them.
`end_sessions` ends every session of a user at once, and `session_deleted`
tells who follows a session (live pages) that its key is gone: signed out,
or replaced by a sign-in (Django's login gives every sign-in a new key)."""
from __future__ import annotations

from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore as DBStore
from django.dispatch import Signal

session_deleted = Signal()  # session_key, store


class SessionStore(DBStore):
    @classmethod
    def get_model_class(cls):
        from controlplane.models import UserSession

        return UserSession

    def create_model_instance(self, data):
        session = super().create_model_instance(data)
        try:
            session.user_id = int(data.get(SESSION_KEY))
        except (TypeError, ValueError):
            session.user_id = None
        return session

    def delete(self, session_key=None):
        key = session_key or self.session_key
        super().delete(session_key)
        if key:
            session_deleted.send(sender=type(self), session_key=key, store=self)


def end_sessions(user_id: int) -> int:
    """Sign `user_id` out everywhere: their sessions are deleted, so none
    comes back when the user is made active again."""
    from controlplane.models import UserSession

    return UserSession.objects.filter(user_id=user_id).delete()[0]
