"""Send authority: where sending (inbox) asks send policy (grants).

Under `open`, membership is the authority and nothing here is consulted.
Any other send policy is decided by the registered `SendPolicy`: grants
registers its `explicit_only` policy (grants.authorization.GrantPolicy) in
GrantsConfig.ready(). Inbox rows record the authority each copy was sent
under (an id and a generation); whether that authority still holds is the
policy's answer too. The policy never writes inbox rows: when authority
ends, grants asks inbox services to withhold and reject the items
(inbox.services.withhold_items_under, reject_items_under).

This is the one seam from inbox up to grants, so apps stay layered
(docs/architecture.md): inbox never imports grants.
"""
from __future__ import annotations

from typing import Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from controlplane.models import Member, Space


class Authority(Protocol):
    """What a recipient's copy is sent under (a grant)."""
    pk: int
    generation: int


class SendPolicy(Protocol):
    def authorize(self, space: Space, author: Member, recipients: list[Member], *,
                  idempotency_key: str | None) -> dict[int, Authority]:
        """The authority for each recipient (by member pk), locked until the
        caller's transaction commits; GrantRequired naming the uncovered."""

    def uncovered_each(self, space: Space, authors: list[Member], recipients: list[Member]) -> dict[int, list[Member]]:
        """For each author (by pk) whom standing authority does not let send
        to every one of `recipients`, those it does not; all of it locked in
        one statement until the caller's transaction commits."""

    def consume(self, authority: dict[int, Authority], message) -> None:
        """Bind single-use authority to the message it authorized."""

    def request_approval(self, message, uncovered: list[Member], collective: dict | None = None) -> dict:
        """Retain the refused `message` (and its `collective`, if any) for an
        admin's decision; its rendering."""

    def inactive(self) -> Q:
        """A filter over rows with `grant` and `grant_generation` fields
        (Recipient) keeping those whose authority no longer holds."""

    def lock_active(self, authority_id: int) -> bool:
        """Lock the authority's row; whether it still holds."""


_policy: SendPolicy | None = None


def register(policy: SendPolicy) -> None:
    global _policy
    _policy = policy


def send_policy() -> SendPolicy:
    if _policy is None:
        raise ImproperlyConfigured("No send policy is registered: add the grants app to INSTALLED_APPS.")
    return _policy


def inactive() -> Q:
    """Rows whose authority lapsed; none without a policy (nothing was sent
    under authority then)."""
    return _policy.inactive() if _policy is not None else Q(pk__in=[])


def lock_active(authority_id: int | None) -> bool:
    """Whether an item sent under `authority_id` (None: membership) may still
    be handed over, with the authority locked until the caller commits."""
    return authority_id is None or send_policy().lock_active(authority_id)
