"""The inbox firewall (SPEC §7): per-recipient ordered rules that admit an
item (with optional guidance) or hold it privately for audit.

With rules present, new items wait as `unclassified` and a django-q2 worker
settles them outside the send transaction. One member's items settle one at
a time, in insertion order, under that member's mailbox row lock (taken with
SKIP LOCKED, so workers never wait on each other): every conversation's
items are therefore admitted in order, each exactly once, however many
workers run. A hold advances the conversation just like an admission.
Matching (RE2, linear time) happens before any lock is taken. A
collective's result is held where its request was, and otherwise each of
its answers is matched as if its answerer had sent it.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import re2

from django.db import transaction
from django.db.models import Exists, OuterRef

from controlplane import audit
from controlplane.access import space_readable_by_row_member
from controlplane.clock import now
from controlplane.errors import AuthorityRevoked, InvalidRequest, UnknownDelivery
from controlplane.live import kick_once_on_commit
from controlplane.models import Conversation, Member
from controlplane.log import append_events
from inbox import authority, collectives, events, mailbox
from inbox.models import FirewallRule, InboxItem, Mailbox

log = logging.getLogger(__name__)

MAX_RULES = 50
MAX_PATTERN = 200


@dataclass(frozen=True)
class Decision:
    action: str
    guidance: str | None


# Patterns are matched by RE2, in time linear in the content: no pattern can
# make a match backtrack for minutes. RE2 lacks backreferences and
# lookaround; such a pattern is refused when the rules are set.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = 8 << 20


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str):
    """The compiled pattern, or InvalidRequest naming why RE2 refuses it."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise InvalidRequest("content_pattern is not a regular expression this server can match in linear time "
                             "(RE2 syntax: no backreferences or lookaround).",
                             details={"content_pattern": pattern, "error": _text(exc)}) from None


def _text(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else ""
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)


def _matches(rule: FirewallRule, item: InboxItem) -> bool:
    payload = item.payload
    conversation = item.conversation
    return all([
        rule.sender is None or payload.get("sender") == f"@{rule.sender}",
        rule.space is None or (conversation is not None and conversation.space.slug == rule.space),
        rule.conversation_kind is None or (conversation is not None and conversation.kind == rule.conversation_kind),
        rule.min_bytes is None or item.content_bytes >= rule.min_bytes,
        rule.content_pattern is None
        or compile_pattern(rule.content_pattern).search(payload.get("content", "")) is not None,
    ])


UNDECIDABLE = "The firewall could not evaluate rule {n} on this item; it is held for review."


def decide(rules: list[FirewallRule], item: InboxItem) -> Decision:
    """The first matching rule decides; no match admits. A rule that cannot
    be evaluated (a stored pattern RE2 refuses, say) holds the item, with
    guidance saying so: the outcome is always recorded."""
    for n, rule in enumerate(rules, 1):
        try:
            matched = _matches(rule, item)
        except Exception:
            log.exception("firewall rule %d of member %s could not be evaluated", n, item.member_id)
            return Decision(FirewallRule.Action.HOLD, UNDECIDABLE.format(n=n))
        if matched:
            return Decision(rule.action, rule.guidance)
    return Decision(FirewallRule.Action.ALLOW, None)


def _decide_answers(rules: list[FirewallRule], result: InboxItem) -> Decision:
    """A collective's result carries its answerers' text, so each answer is
    matched as an item from its answerer would be, in the result's
    conversation: the first answer held holds the result. Otherwise it is
    admitted, with the first guidance an answer's rule gave. A result that
    carries no answers (a reference) is matched on nothing."""
    guidance = None
    for answer in result.payload.get("answers", ()):
        if "answer" not in answer:
            continue  # missing: no text
        text = answer["answer"]
        as_sent = InboxItem(member_id=result.member_id, conversation=result.conversation,
                            payload={"sender": answer["member"], "content": text},
                            content_bytes=len(text.encode()))
        decision = decide(rules, as_sent)
        if decision.action == FirewallRule.Action.HOLD:
            return decision
        guidance = guidance or decision.guidance
    return Decision(FirewallRule.Action.ALLOW, guidance)


# A collective's outcomes, judged by their request's decision and their answers (inbox.collectives).
OUTCOMES = ("collective.result", "operationFailed")


def _request_held(result: InboxItem) -> bool:
    """Whether this member's firewall held the request `result` answers
    (they never saw what it answers). The requester had no request item."""
    return InboxItem.objects.filter(
        member_id=result.member_id, kind="collective.request", admission=InboxItem.Admission.HELD,
        message__public_id=result.payload["collective"]["message"]).exists()


def _rules(member_id: int) -> list[FirewallRule]:
    return list(FirewallRule.objects.filter(member_id=member_id).order_by("ordinal"))


def classify_next(member_id: int) -> bool:
    """Settle `member_id`'s oldest unclassified item. False when there is
    none, or when another worker holds this member (it will carry on).

    The decision is made first, outside any transaction (matching holds no
    lock, and on SQLite not the database's write lock); it is applied under
    the member's mailbox lock only if that item is still the oldest
    unclassified one and the rules are those it was decided by (else the
    caller's loop decides again). So items settle one at a time, in order,
    each exactly once, however many workers run."""
    candidate = (InboxItem.objects.select_related("conversation__space")
                 .filter(member_id=member_id, admission=InboxItem.Admission.UNCLASSIFIED)
                 .order_by("position", "id").first())
    if candidate is None:
        return False
    rules = _rules(member_id)
    result = candidate.kind in OUTCOMES  # (a failure carries no answers: judged by its request alone)
    decision = _decide_answers(rules, candidate) if result else decide(rules, candidate)
    with transaction.atomic():
        box = Mailbox.objects.select_for_update(skip_locked=True, no_key=True).filter(member_id=member_id).first()
        if box is None:
            return False
        # The item's own lock too: a revocation barrier may withhold it meanwhile.
        item = (InboxItem.objects.select_for_update(of=("self",), no_key=True).select_related("conversation__space")
                .filter(member_id=member_id, admission=InboxItem.Admission.UNCLASSIFIED)
                .order_by("position", "id").first())
        if item is None:
            return False
        current = list(FirewallRule.objects.filter(member_id=member_id).order_by("ordinal")
                       .values_list("pk", flat=True))
        if item.pk != candidate.pk or current != [r.pk for r in rules]:
            return True  # settled by another worker, or the rules changed: decide again
        if result and _request_held(item):  # looked at under the lock: the request may be released meanwhile
            decision = Decision(FirewallRule.Action.HOLD, None)
        if not _still_a_reader(item):
            _reject_unread(item)
            return True
        item.settled_at, item.guidance = now(), decision.guidance
        if decision.action == FirewallRule.Action.HOLD:
            item.admission = InboxItem.Admission.HELD
            # Held content is not pending inbox content (it stays in its sender's share).
            mailbox.hold(member_id, item.content_bytes)
        else:
            item.admission = InboxItem.Admission.ADMITTED
            _announce_admitted(item)
        item.save(update_fields=["admission", "guidance", "settled_at"])
        return True


def _still_a_reader(item: InboxItem) -> bool:
    """Whether `item`'s member may still read its space, by their membership
    (a suspended member's items are judged as anyone's)."""
    return InboxItem.objects.filter(pk=item.pk).filter(space_readable_by_row_member("conversation__space")).exists()


REMOVED = "Its recipient left the space before the firewall judged it."


def _reject_unread(item: InboxItem) -> None:
    """Settle an item judged after its member left a space they can no
    longer read: removal stops all delivery from a space at once (SPEC §3),
    so it is rejected, neither admitted nor held, and its bytes leave the
    mailbox and its sender's share. What was admitted or held before the
    removal stays the member's."""
    item.state, item.reason, item.settled_at = InboxItem.State.REJECTED, REMOVED, now()
    item.admission = InboxItem.Admission.HELD  # judged, never admitted: no longer waiting
    item.save(update_fields=["state", "reason", "settled_at", "admission"])
    mailbox.debit(item.member_id, item.content_bytes, sender_id=item.sender_id)  # counted while it waited


def _announce_admitted(item: InboxItem) -> None:
    """The admitted item reaches the inbox feed and inbox wakes (an event
    addressed to its member) and live inbox clients: if its member is still
    a reader of its space (suspended or not: their feed is theirs again when
    they are back). One removed meanwhile, releasing what was held before,
    is told nothing: the inbox feed leaves out spaces its reader left."""
    if not _still_a_reader(item):
        return
    if item.message_id is not None:
        append_events([events.message_admitted(item.message, item.member)])
    elif item.kind in OUTCOMES:
        (event,) = append_events([collectives.outcome_event(item.member, item.payload["collective"]["message"],
                                                            item.conversation.space_id, item.payload.get("reason"))])
        # A notice sits at its event's position: now the admission's, which
        # reaches its member (the screened one reached no one), so readers
        # that find items through their feed's events find it there.
        item.position = event.position
        item.save(update_fields=["position"])
    mailbox.announce_available(item.member)


def classify_pending(member_id: int, *, limit: int = 10_000) -> int:
    """Settle `member_id`'s unclassified items in order; returns how many.
    Once none is left, a member whose rules were cleared meanwhile has
    their new items admitted at once again (refresh_firewall_flag)."""
    settled = 0
    while settled < limit:
        if not classify_next(member_id):
            if not FirewallRule.objects.filter(member_id=member_id).exists():
                refresh_firewall_flag(member_id)
            break
        settled += 1
    return settled


def members_flagged_without_reason() -> list[int]:
    """Members whose new items wait for classification though they have
    no rules and nothing waits (the run that would have cleared the flag
    was lost, or a barrier settled their last waiting item)."""
    return list(Mailbox.objects.filter(firewall=True)
                .exclude(Exists(FirewallRule.objects.filter(member_id=OuterRef("member_id"))))
                .exclude(Exists(InboxItem.objects.filter(member_id=OuterRef("member_id"),
                                                         admission=InboxItem.Admission.UNCLASSIFIED)))
                .values_list("member_id", flat=True))


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
        item = held.select_for_update(no_key=True).first()
        if item is None:
            raise UnknownDelivery("No such held item.")
        if item.state == InboxItem.State.REJECTED:  # the barrier settled it, or a removal did
            if item.reason == REMOVED:
                raise UnknownDelivery("No such held item.")
            raise AuthorityRevoked("The grant this item was sent under is no longer active.")
        item.admission, item.settled_at = InboxItem.Admission.ADMITTED, now()
        item.save(update_fields=["admission", "settled_at"])
        audit.record("inbox.item_released", member.public_id, actor=actor, item=item.token)
        mailbox.release(member.pk, item.content_bytes)
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
            compile_pattern(pattern)
        kind = rule.get("conversation_kind")
        if kind is not None and kind not in Conversation.Kind.values:
            raise InvalidRequest("conversation_kind must be channel, direct or group.")
    with transaction.atomic():
        # Replacements take turns: two at once each deleted the rules it saw, then collided on the order.
        mailbox.lock([member.pk], create=True)
        FirewallRule.objects.filter(member=member).delete()
        created = FirewallRule.objects.bulk_create(
            FirewallRule(member=member, ordinal=i, **rule) for i, rule in enumerate(rules))
        refresh_firewall_flag(member.pk)
        audit.record("inbox.firewall_rules_set", member.public_id, actor=actor, rules=len(created))
        if InboxItem.objects.filter(member=member, admission=InboxItem.Admission.UNCLASSIFIED).exists():
            # judged by the new rules now, not at the next sweep: new items wait their turn until then
            kick_once_on_commit("inbox.tasks.classify_pending", member.pk)
        return created


def refresh_firewall_flag(member_id: int) -> None:
    """Whether new items for `member_id` wait for classification: while they
    have rules, and after the rules are cleared until the items waiting then
    are judged, so that none is admitted ahead of an earlier one (a send
    reads the flag under the mailbox row's lock, taken here too)."""
    with transaction.atomic():
        mailbox.lock([member_id], create=True)
        waiting = (FirewallRule.objects.filter(member_id=member_id).exists() or InboxItem.objects.filter(
            member_id=member_id, admission=InboxItem.Admission.UNCLASSIFIED).exists())
        Mailbox.objects.filter(member_id=member_id).update(firewall=waiting)
