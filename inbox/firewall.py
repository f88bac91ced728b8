"""The inbox firewall (SPEC §7): per-recipient ordered rules that admit an
item (with optional guidance) or hold it privately for audit.

With rules present, new items wait as `unclassified` and a django-q2 worker
settles them outside the send transaction. One member's items settle one at
a time, in insertion order, under that member's mailbox row lock (taken with
SKIP LOCKED, so workers never wait on each other): every conversation's
items are therefore admitted in order, each exactly once, however many
workers run. A hold advances the conversation just like an admission.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import transaction

from controlplane import audit
from controlplane.clock import now
from controlplane.errors import AuthorityRevoked, InvalidRequest, UnknownDelivery
from controlplane.models import Conversation, Member
from controlplane.log import append_events
from inbox import authority, events, mailbox
from inbox.models import FirewallRule, InboxItem, Mailbox

MAX_RULES = 50
MAX_PATTERN = 200


@dataclass(frozen=True)
class Decision:
    action: str
    guidance: str | None


def _matches(rule: FirewallRule, item: InboxItem) -> bool:
    payload = item.payload
    conversation = item.conversation
    return all([
        rule.sender is None or payload.get("sender") == f"@{rule.sender}",
        rule.space is None or (conversation is not None and conversation.space.slug == rule.space),
        rule.conversation_kind is None or (conversation is not None and conversation.kind == rule.conversation_kind),
        rule.content_pattern is None or re.search(rule.content_pattern, payload.get("content", "")) is not None,
        rule.min_bytes is None or item.content_bytes >= rule.min_bytes,
    ])


def decide(rules: list[FirewallRule], item: InboxItem) -> Decision:
    """The first matching rule decides; no match admits."""
    for rule in rules:
        if _matches(rule, item):
            return Decision(rule.action, rule.guidance)
    return Decision(FirewallRule.Action.ALLOW, None)


def classify_next(member_id: int) -> bool:
    """Settle `member_id`'s oldest unclassified item. False when there is
    none, or when another worker holds this member (it will carry on)."""
    with transaction.atomic():
        box = Mailbox.objects.select_for_update(skip_locked=True).filter(member_id=member_id).first()
        if box is None:
            return False
        # The item's own lock too: a revocation barrier may withhold it meanwhile.
        item = (InboxItem.objects.select_for_update(of=("self",)).select_related("conversation__space")
                .filter(member_id=member_id, admission=InboxItem.Admission.UNCLASSIFIED)
                .order_by("position", "id").first())
        if item is None:
            return False
        decision = decide(list(FirewallRule.objects.filter(member_id=member_id).order_by("ordinal")), item)
        item.settled_at, item.guidance = now(), decision.guidance
        if decision.action == FirewallRule.Action.HOLD:
            item.admission = InboxItem.Admission.HELD
            # Held content is not pending inbox content.
            mailbox.debit(member_id, item.content_bytes)
        else:
            item.admission = InboxItem.Admission.ADMITTED
            _announce_admitted(item)
        item.save(update_fields=["admission", "guidance", "settled_at"])
        return True


def _announce_admitted(item: InboxItem) -> None:
    """The admitted item reaches the inbox feed and inbox wakes (an event
    addressed to its member) and live inbox clients."""
    if item.message_id is not None:
        append_events([events.message_admitted(item.message, item.member)])
    mailbox.announce_available(item.member)


def classify_pending(member_id: int, *, limit: int = 10_000) -> int:
    """Settle `member_id`'s unclassified items in order; returns how many."""
    settled = 0
    while settled < limit and classify_next(member_id):
        settled += 1
    return settled


def members_with_unclassified_items() -> list[int]:
    return list(InboxItem.objects.filter(admission=InboxItem.Admission.UNCLASSIFIED)
                .values_list("member_id", flat=True).distinct())


def release_item(member: Member, token: str, *, actor: Member) -> InboxItem:
    """Admit a held item (its owner, or an admin through the admin). An item
    sent under a grant needs that grant active: its row is locked first, in
    the order a revocation barrier takes the same rows, so a release either
    happens before the barrier (which then settles the item) or is refused."""
    held = InboxItem.objects.filter(member=member, token=token, admission=InboxItem.Admission.HELD)
    with transaction.atomic():
        grant_id = held.values_list("grant_id", flat=True).first()
        if not authority.lock_active(grant_id):
            raise AuthorityRevoked("The grant this item was sent under is no longer active.")
        item = held.select_for_update().first()
        if item is None:
            raise UnknownDelivery("No such held item.")
        if item.state == InboxItem.State.REJECTED:  # the barrier settled it
            raise AuthorityRevoked("The grant this item was sent under is no longer active.")
        item.admission, item.settled_at = InboxItem.Admission.ADMITTED, now()
        item.save(update_fields=["admission", "settled_at"])
        audit.record("inbox.item_released", member.public_id, actor=actor, item=item.token)
        mailbox.credit(member.pk, item.content_bytes)
        _announce_admitted(item)
        return item


def set_rules(member: Member, rules: list[dict], *, actor: Member) -> list[FirewallRule]:
    """Replace `member`'s rules with `rules` (in order). Items already
    settled keep their decision; new items follow the new rules."""
    if len(rules) > MAX_RULES:
        raise InvalidRequest(f"At most {MAX_RULES} rules.")
    for rule in rules:
        pattern = rule.get("content_pattern")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise InvalidRequest("content_pattern is not a valid regular expression.",
                                     details={"content_pattern": pattern, "error": str(exc)}) from None
        kind = rule.get("conversation_kind")
        if kind is not None and kind not in Conversation.Kind.values:
            raise InvalidRequest("conversation_kind must be channel, direct or group.")
    with transaction.atomic():
        Mailbox.objects.get_or_create(member=member)
        FirewallRule.objects.filter(member=member).delete()
        created = FirewallRule.objects.bulk_create(
            FirewallRule(member=member, ordinal=i, **rule) for i, rule in enumerate(rules))
        refresh_firewall_flag(member)
        audit.record("inbox.firewall_rules_set", member.public_id, actor=actor, rules=len(created))
        return created


def refresh_firewall_flag(member: Member) -> None:
    """Whether new items for `member` wait for classification: exactly when
    they have rules (called whenever rules change, from the API or the admin)."""
    has_rules = FirewallRule.objects.filter(member=member).exists()
    Mailbox.objects.update_or_create(member=member, defaults={"firewall": has_rules})
