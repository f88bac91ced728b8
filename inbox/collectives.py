"""Collective requests (SPEC §7b): `gather` and `all_gather` over a group
conversation.

A group message that carries `"collective": {"op", "deadline_ms"}` is sent
like any other (the same checks, grants, limits and idempotency), but each
other member's item is a `collective.request`. Members answer with
`answer()`; answers are stored here and never delivered to anyone but in
the result. When every member has answered, or the deadline has passed, the
operation finishes once: one `collective.result` item, answers in
membership order and missing ones marked, to the requester (`gather`) or to
the requester and every member (`all_gather`). One that cannot complete
(a member or the requester removed from the space or suspended, the
message's authority revoked) ends with an `operationFailed` item saying
why, to the same people.

A result carries the answerers' content: it counts against its
recipient's mailbox and the requester's share of it, goes as a reference
past them (`answers_for` reads the answers), and gets its request's
firewall decision (docs/collectives.md).

Everything is in the database: a restart loses nothing. Deadlines are
finished by the worker's minute schedule (`finish_due`, all that are due,
for up to 20 s a run) and whenever the operation is touched (an answer, a
read of the message), so a result comes at most about a minute after its
deadline.
"""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import replace

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from controlplane.access import active_membership, can_read_space, require_sender
from controlplane.clock import now, rfc3339
from controlplane.live import kick_on_commit, kick_once_on_commit
from controlplane.log import NewEvent
from controlplane.errors import Conflict, Forbidden, GrantRequired, IdempotencyConflict, InvalidRequest
from controlplane.models import Conversation, Member, Participant, Space
from inbox import authority, mailbox, notices
from inbox.items import content_bytes
from inbox.models import Collective, CollectiveAnswer, InboxItem, Mailbox, Message, Recipient
from inbox.text import encode_text

MIN_DEADLINE_MS = 1_000
MAX_DEADLINE_MS = 86_400_000
MAX_ANSWER_BYTES = 8 * 1024
DUE_PER_RUN = 100
DUE_SECONDS = 20.0  # of one run of the minute schedule


def validate(conversation: Conversation, spec) -> dict:
    """The `collective` field of a send: `{"op", "deadline_ms"}` on a group
    conversation, else 400 INVALID_REQUEST."""
    if not isinstance(spec, dict) or set(spec) != {"op", "deadline_ms"}:
        raise InvalidRequest('`collective` is {"op": "gather" | "all_gather", "deadline_ms": …}.')
    if spec["op"] not in Collective.Op.values:
        raise InvalidRequest("`collective.op` is gather or all_gather.", details={"op": spec["op"]})
    deadline = spec["deadline_ms"]
    if type(deadline) is not int or not MIN_DEADLINE_MS <= deadline <= MAX_DEADLINE_MS:
        raise InvalidRequest(f"`collective.deadline_ms` is an integer of {MIN_DEADLINE_MS}–{MAX_DEADLINE_MS}.")
    if conversation.kind != Conversation.Kind.GROUP:
        raise InvalidRequest("A collective request goes to a group conversation.")
    return {"op": spec["op"], "deadline_ms": deadline}


def request_fields(spec: dict, at: dt.datetime) -> dict:
    """What a `collective.request` item carries beside the group message."""
    return {"op": spec["op"], "deadline": rfc3339(at + dt.timedelta(milliseconds=spec["deadline_ms"]))}


def start(message: Message, recipients: list[Member], spec: dict) -> Collective:
    """Record the operation of a collective message just inserted, in its
    transaction. The members are the group's others, in membership order."""
    order = list(Participant.objects.filter(conversation=message.conversation).order_by("ordinal")
                 .values_list("member_id", flat=True))
    answering = [pk for pk in order if pk in {r.pk for r in recipients}]
    collective = Collective.objects.create(
        message=message, op=spec["op"], requester_id=message.author_id, members=answering,
        deadline_at=message.created_at + dt.timedelta(milliseconds=spec["deadline_ms"]))
    if not answering or any(r.status != Member.Status.ACTIVE for r in recipients):
        # Over at once (no one to answer: every member has), or never to
        # complete (a suspended member owes an answer): settled after the
        # commit, not at the deadline, up to a day later.
        kick_on_commit("inbox.tasks.settle_collectives", [message.pk])
    return collective


def _locked(message: Message) -> Collective | None:
    """The operation's row only (not its space's, message's or requester's,
    which the join would lock too on PostgreSQL)."""
    return (Collective.objects.select_for_update(of=("self",), no_key=True)
            .select_related("message__space", "message__conversation", "requester").filter(message=message).first())


def answer(message: Message, body: str, *, actor: Member,
           idempotency_key: str | None = None) -> tuple[CollectiveAnswer, bool]:
    """`actor`'s answer (idempotent: the same answer again returns it; a
    different one is 409 CONFLICT, or IDEMPOTENCY_CONFLICT under the key the
    first was given with: a request with the same key at once has not found
    the first's record, which is stored after its work). Finishes the
    operation when it was the last one. Returns (answer, created)."""
    encode_text(body, field="body", max_bytes=MAX_ANSWER_BYTES)
    with transaction.atomic():
        collective = _locked(message)
        if collective is None:
            raise InvalidRequest("This message is not a collective request.")
        if actor.pk not in collective.members:
            raise Forbidden("Only the group's other members answer a collective request.")
        existing = CollectiveAnswer.objects.filter(collective=collective, member=actor).first()
        if existing is not None:
            if existing.body != body and idempotency_key and existing.idempotency_key == idempotency_key:
                raise IdempotencyConflict()
            if existing.body != body:
                raise Conflict("You answered already, with a different answer.",
                               details={"state": collective.state, "reason": collective.reason})
            return existing, False
        require_sender(collective.message.space, actor)  # a new answer is written as a send is: not by observers
        _settle(collective)  # one that cannot complete any more fails now, and that commits
        created = None
        if collective.state == Collective.State.PENDING:
            # Still pending, so the settle wrote nothing for a refusal to roll back.
            if uncovered := _unreached(collective, also=actor).get(f"@{actor.handle}"):
                raise GrantRequired("An answer goes where its result goes, as a send would: "
                                    "a grant must cover each of them.",
                                    details={"recipients": [f"@{m.handle}" for m in uncovered]}, uncovered=uncovered)
            created = CollectiveAnswer.objects.create(collective=collective, member=actor, body=body,
                                                      idempotency_key=idempotency_key)
            _settle(collective)
    if created is None:
        raise Conflict("The operation has finished.", details={"state": collective.state, "reason": collective.reason})
    return created, True


def touch(message: Message) -> None:
    """A read of the message finishes its operation if it is due."""
    if Collective.objects.filter(message=message, state=Collective.State.PENDING, deadline_at__lte=now()).exists():
        with transaction.atomic():
            collective = _locked(message)
            if collective is not None:
                _settle(collective)


def fail_under(grant_pk: int | None = None) -> None:
    """A grant's barrier has fenced it: the pending operations requested
    under it can no longer complete (`authority_revoked`), and each fails
    now, in a transaction of its own, not at its deadline or next answer
    (its members' requests were just rejected: nobody answers any more).
    Without a grant, those of every authority that no longer holds (the
    barriers' minute recovery: a process may have stopped between a
    barrier's end and this)."""
    under = (Q(message__recipients__grant_id=grant_pk) if grant_pk is not None else
             Exists(Recipient.objects.filter(authority.inactive(), message_id=OuterRef("message_id"))))
    settle(Collective.objects.filter(under, state=Collective.State.PENDING).values_list("message_id", flat=True)
           .distinct())


def settle(message_ids: Iterable[int]) -> None:
    """Finish each of these operations that can or must be, each in a
    transaction of its own."""
    for message_id in message_ids:
        with transaction.atomic():
            collective = _locked(Message(pk=message_id))
            if collective is not None:
                _settle(collective)


def settle_owed_by(member_id: int) -> None:
    """A member was suspended: the pending operations that wait for their
    answer (`member_removed`), and those they asked (`requester_gone`),
    fail now, not at their deadline or next answer."""
    pending = Collective.objects.filter(state=Collective.State.PENDING)
    settle([*pending.filter(message__recipients__member_id=member_id).values_list("message_id", flat=True),
            *pending.filter(requester_id=member_id).values_list("message_id", flat=True)])


def finish_due(*, seconds: float = DUE_SECONDS) -> int:
    """The minute schedule: finish operations whose deadline has passed,
    DUE_PER_RUN at a time, until none is left or `seconds` have passed (a
    burst of deadlines finishes in this run, not a hundred a minute).
    Returns how many finished."""
    finished, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        due = list(Collective.objects.filter(state=Collective.State.PENDING, deadline_at__lte=now())
                   .order_by("deadline_at").values_list("message_id", flat=True)[:DUE_PER_RUN])
        batch = 0
        for message_id in due:
            if time.monotonic() >= until:
                break
            with transaction.atomic():
                collective = (Collective.objects.select_for_update(of=("self",), skip_locked=True, no_key=True)
                              .select_related("message__space", "message__conversation", "requester")
                              .filter(message_id=message_id, state=Collective.State.PENDING).first())
                if collective is not None:
                    _settle(collective)
                    batch += collective.state != Collective.State.PENDING
        finished += batch
        if len(due) < DUE_PER_RUN or not batch:  # all done, or the rest is another worker's for now
            break
    return finished


def fail_for_removed(space_id: int, member_id: int) -> None:
    """A member left or was removed from a space: its pending operations
    that count on them fail, in the removal's transaction before it appends
    its event (controlplane.services.register_removal_hook), in the system's
    lock order: the operations' rows (id order), then the mailbox of
    everyone owed an outcome of any of them (inbox.mailbox.lock), then the
    log head, with the first notice."""
    failing = []
    for collective in (Collective.objects.select_for_update(of=("self",), no_key=True)
                       .select_related("message__space", "message__conversation", "requester")
                       .filter(state=Collective.State.PENDING, message__space_id=space_id).order_by("pk")):
        if collective.requester_id == member_id:
            failing.append((collective, "requester_gone"))
        elif member_id in collective.members and member_id not in _answered(collective):
            failing.append((collective, "member_removed"))
    mailbox.lock((pk for collective, _ in failing for pk in _owed(collective)), create=True)
    for collective, reason in failing:
        _fail(collective, reason)


def _answered(collective: Collective) -> set[int]:
    return set(CollectiveAnswer.objects.filter(collective=collective).values_list("member_id", flat=True))


def _problem(collective: Collective) -> str | None:
    """Why the operation can no longer complete, if it cannot. A member who
    answered and left since does not stop it: their answer is in."""
    space = collective.message.space
    if space.archived:  # no answer is taken any more
        return "space_archived"
    if not collective.requester.is_active or not can_read_space(space, collective.requester):
        return "requester_gone"
    answered = _answered(collective)
    owing = [pk for pk in collective.members if pk not in answered]
    active = set(Member.objects.filter(pk__in=owing, status=Member.Status.ACTIVE).values_list("pk", flat=True))
    if len(active) < len(owing) or not all(can_read_space(space, m) for m in Member.objects.filter(pk__in=owing)):
        return "member_removed"
    if Recipient.objects.filter(message=collective.message).filter(authority.inactive()).exists():
        return "authority_revoked"
    return None


def _outcome(collective: Collective) -> dict:
    """`ended` and the answers, in membership order, missing ones marked."""
    answers = {a.member_id: a for a in CollectiveAnswer.objects.filter(collective=collective)}
    handles = dict(Member.objects.filter(pk__in=collective.members).values_list("pk", "handle"))
    members = [pk for pk in collective.members if pk in handles]  # a deleted member's answer went with them
    return {"ended": "all_answered" if len(answers) == len(members) else "deadline",
            "answers": [{"member": f"@{handles[pk]}", "answer": answers[pk].body,
                         "answered_at": rfc3339(answers[pk].answered_at)}
                        if pk in answers else {"member": f"@{handles[pk]}", "missing": True}
                        for pk in members]}


def _readers(collective: Collective) -> list[Member]:
    """Whom the outcome goes to now: of those it is owed (`_owed`), the
    active ones still in the group."""
    return [member for member in Member.objects.filter(pk__in=_owed(collective), status=Member.Status.ACTIVE)
            if _in_the_group_still(collective, member)]


def _unreached(collective: Collective, *, also: Member | None = None,
               readers: list[Member] | None = None) -> dict[str, list[Member]]:
    """For each answerer (by `@handle`: who has answered, and `also`) whose
    answer may not reach some of `readers` (default: `_readers`), those
    readers. An answer goes to them as a send of its answerer would, so
    under `explicit_only` only where a standing grant covers the reader now
    (one-message grants authorize one message, not answers): a grant that
    covered an answer as it was given may have been revoked or expired
    since. The send policy decides, and keeps every grant it read locked
    until the commit, all taken in one statement: an answer takes them for
    the answers before it too, so its finish takes none more."""
    space = collective.message.space
    if space.send_policy == Space.SendPolicy.OPEN:
        return {}
    readers = _readers(collective) if readers is None else readers
    answerers = [*Member.objects.filter(pk__in=_answered(collective)).order_by("pk"), *([also] if also else [])]
    handles = {m.pk: f"@{m.handle}" for m in answerers}
    with transaction.atomic(savepoint=False):  # a read's own, or the caller's: locked until it commits
        return {handles[pk]: left for pk, left in
                authority.send_policy().uncovered_each(space, answerers, readers).items()}


def _unreaching(unreached: dict[str, list[Member]], reader: Member) -> set[str]:
    """The answerers (by `@handle`) in `unreached` whose answers may not reach `reader`."""
    return {answerer for answerer, readers in unreached.items() if reader in readers}


def _without(outcome: dict, answerers: set[str]) -> dict:
    """`outcome` with these answerers' answers marked missing, for a reader they may not reach."""
    if not answerers:
        return outcome
    return {**outcome, "answers": [{"member": a["member"], "missing": True, "reason": "grant_required"}
                                   if a["member"] in answerers else a for a in outcome["answers"]]}


def _settle(collective: Collective) -> None:
    """Finish a locked pending operation if it can or must be."""
    if collective.state != Collective.State.PENDING:
        return
    if problem := _problem(collective):
        _fail(collective, problem)
        return
    everyone = CollectiveAnswer.objects.filter(collective=collective).count() == len(collective.members)
    if not everyone and now() < collective.deadline_at:
        return
    _finish(collective, Collective.State.COMPLETED, None, {"kind": "collective.result", **_outcome(collective)})


def _fail(collective: Collective, reason: str) -> None:
    _finish(collective, Collective.State.FAILED, reason, {"kind": "operationFailed", "reason": reason})


def _existing(ids: list[int]) -> list[int]:
    """`ids` without members deleted since (from a shell, one who never
    wrote may be): `Collective.members` is a list, not foreign keys."""
    existing = set(Member.objects.filter(pk__in=ids).values_list("pk", flat=True))
    return [pk for pk in ids if pk in existing]


def _owed(collective: Collective) -> list[int]:
    """Who is told the outcome: the requester, and for all_gather every member."""
    return _existing([collective.requester_id,
                      *(collective.members if collective.op == Collective.Op.ALL_GATHER else [])])


def _in_the_group_still(collective: Collective, member: Member) -> bool:
    """Whether an outcome owed to `member` still goes to them: the
    requester, or a member still in the space (not one who left it, even an
    open space they may still read)."""
    return member.pk == collective.requester_id or active_membership(collective.message.space, member) is not None


def _finish(collective: Collective, state: str, reason: str | None, outcome: dict) -> None:
    """Mark the operation finished and tell who is owed the outcome (the
    requester, and for all_gather every other member still in the space: not
    one who left it, even an open space they may still read)."""
    collective.state, collective.reason, collective.finished_at = state, reason, now()
    collective.save(update_fields=["state", "reason", "finished_at"])
    message = collective.message
    payload = {**outcome, "collective": {"message": message.public_id, "op": collective.op,
                                         "conversation": message.conversation.public_id,
                                         "space": message.space.slug}}
    owed = _owed(collective)
    readers = _readers(collective)
    unreached = _unreached(collective, readers=readers) if reason is None else {}  # grants before mailboxes
    mailbox.lock(owed, create=True)  # every notice's mailbox, in member order, before the log head
    # An outcome waits for classification where a firewall judges new items, or where the request it
    # answers still waits or was held (rules removed meanwhile): it never overtakes its request.
    firewalled = {*Mailbox.objects.filter(member_id__in=owed, firewall=True).values_list("member_id", flat=True),
                  *InboxItem.objects.filter(message=message, admission__in=[InboxItem.Admission.UNCLASSIFIED,
                                                                             InboxItem.Admission.HELD])
                  .values_list("member_id", flat=True)}
    for member in readers:
        if member.pk == collective.requester_id and reason == "requester_gone":
            continue
        screened = member.pk in firewalled
        if reason is not None:
            # A failure names its request: where the firewall judges, it waits as a result does
            # (held where the request was: it pointed at an item its member was never given).
            notices.post_notice(member, payload, outcome_event(member, message.public_id, message.space_id, reason,
                                                               screened=screened),
                                conversation_id=message.conversation_id,
                                admission=InboxItem.Admission.UNCLASSIFIED if screened else InboxItem.Admission.ADMITTED)
            if screened:
                kick_once_on_commit("inbox.tasks.classify_pending", member.pk)
            continue
        _post_result(member, _without(payload, _unreaching(unreached, member)),
                     outcome_event(member, message.public_id, message.space_id, None, screened=screened),
                     conversation_id=message.conversation_id, requester_id=collective.requester_id,
                     firewalled=screened)


def outcome_event(member: Member, message_id: str, space_id: int, reason: str | None, *,
                  screened: bool = False) -> NewEvent:
    """The private `collective.completed` or `collective.failed` event of an
    outcome's item. A result its member's firewall has yet to judge is
    `screened`: its event takes the item's place in the log and reaches no
    one, and the event its admission (or release) appends reaches them
    (inbox.firewall), as `message.admitted` does for a message."""
    event = notices.private_event(f"collective.{'completed' if reason is None else 'failed'}",
                                  {"message": message_id, "reason": reason}, member, space_id=space_id)
    return replace(event, addressees=()) if screened else event


def _post_result(member: Member, payload: dict, event: NewEvent, *, conversation_id: int, requester_id: int,
                 firewalled: bool) -> None:
    """A result carries the answerers' content, which the requester asked
    for: it counts against `member`'s mailbox and the requester's share of
    it. Past either it goes as a reference (how many answered, and why the
    answers are left out: `answers_for` reads them), a few hundred bytes
    that count against that share all the same, past it if need be: a
    requester whose share is full sends no more requests, so references
    pile up no faster than requests did. With a firewall it waits for
    classification, which gives it its request's decision (inbox.firewall)."""
    omitted = mailbox.fits(member.pk, content_bytes(payload), sender_id=requester_id)
    if omitted is not None:
        answers = payload["answers"]
        payload = {"kind": payload["kind"], "ended": payload["ended"], "answers_omitted": omitted,
                   "answered": sum("answer" in a for a in answers), "asked": len(answers),
                   "collective": payload["collective"]}
    notices.post_notice(member, payload, event, conversation_id=conversation_id, sender_id=requester_id,
                        admission=InboxItem.Admission.UNCLASSIFIED if firewalled else InboxItem.Admission.ADMITTED)
    if firewalled:
        kick_once_on_commit("inbox.tasks.classify_pending", member.pk)


def answers_for(message: Message, member: Member) -> dict:
    """The outcome of a finished collective request, for whom it is owed
    (the requester; with all_gather every member): `{"ended", "answers"}`.
    403 for anyone else, a member who left the space too (the result did
    not go to them), and 409 while it is pending or when it failed."""
    touch(message)
    collective = Collective.objects.select_related("message__space").filter(message=message).first()
    if collective is None:
        raise InvalidRequest("This message is not a collective request.")
    if member.pk not in _owed(collective) or not _in_the_group_still(collective, member):
        raise Forbidden("The answers go to the requester (and, with all_gather, to every member).")
    if collective.state != Collective.State.COMPLETED:
        raise Conflict("The operation has not completed.", details={"state": collective.state,
                                                                     "reason": collective.reason})
    result = (InboxItem.objects.filter(member=member, kind="collective.result",
                                       payload__collective__message=message.public_id)
              .values_list("admission", flat=True).first())
    if result not in (None, InboxItem.Admission.ADMITTED):
        # The result their firewall holds (or has yet to judge) carries these answers: every
        # read path sees admitted items only (SPEC §7), this one too.
        raise Conflict("The result is not in your inbox: your firewall holds it, or has yet to judge it.",
                       details={"state": "held" if result == InboxItem.Admission.HELD else "unclassified"})
    return _without(_outcome(collective), _unreaching(_unreached(collective, readers=[member]), member))
