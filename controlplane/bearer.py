"""Bearer credentials: issued (the token shown once, only its hash kept)
and revoked, each recorded in the audit log."""
from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal

from controlplane import audit
from controlplane.errors import LimitExceeded, RateLimited
from controlplane.models import Credential, Member
from controlplane.names import checked_name
from controlplane.ratelimit import hit
from controlplane.tokens import hash_token, new_bearer_token

MAX_CREDENTIALS = 20

# Sent (with `credential`) in a revocation's transaction, before the row
# goes: apps above this one end what the credential set going (webhooks:
# the MCP push subscriptions it made, which send whole messages).
credential_revoked = Signal()


def issue_credential(member: Member, *, actor: Member | None, name: str = "") -> tuple[Credential, str]:
    """A new bearer credential; the token is returned here and never again.
    A member holds at most MAX_CREDENTIALS (409 LIMIT_EXCEEDED beyond), and
    asks for at most CREDENTIALS_PER_HOUR (429), from the API or the web app;
    an operator's command (no actor) is not counted."""
    checked_name("name", name, Credential._meta.get_field("name").max_length, blank=True)
    if actor is not None and (wait := hit(f"credentials:{member.public_id}", limit=settings.CREDENTIALS_PER_HOUR,
                                          window=3600)):
        raise RateLimited.after(wait, "Too many new credentials this hour.")
    token = new_bearer_token()
    with transaction.atomic():
        Member.take_turns(member.pk)  # so that two at once cannot both count one place left
        if Credential.objects.filter(member=member).count() >= MAX_CREDENTIALS:
            raise LimitExceeded(f"A member holds at most {MAX_CREDENTIALS} credentials; delete one first.")
        credential = Credential.objects.create(member=member, token_hash=hash_token(token), name=name)
        audit.record("credential.issued", member.public_id, actor=actor, credential=credential.public_id)
    return credential, token


def revoke_credential(credential: Credential, *, actor: Member | None) -> None:
    with transaction.atomic():
        audit.record("credential.revoked", credential.member.public_id, actor=actor,
                     credential=credential.public_id)
        credential_revoked.send(sender=Credential, credential=credential)
        credential.delete()  # its streams end once this commits (controlplane.api.authentication)
