"""Tasks (SPEC §10): create, update, and the status changes, each with its
event in the space feed. Claims and their silence are in coordination.claims.

Who may do what (the contract names the completers; the rest follows):
- create, claim: members who may write in the space (not observers); a task
  with an assignee is claimed by the assignee only (or a space admin);
- update: the creator, the assignee, or a space admin;
- release, submit: the claimant (release: or a space admin);
- complete, reopen: the reviewer, the assignee, or a space admin.
A space admin is an owner of the space or a server admin.
"""
from __future__ import annotations

from django.db import transaction

from controlplane.access import can_read_space, may_administer, require_sender
from controlplane.clock import now
from controlplane.errors import Conflict, Forbidden, InvalidRequest, LimitExceeded, NotFound
from controlplane.events import conversation_created
from controlplane.log import append_events
from controlplane.models import Conversation, Member, Membership, Space
from controlplane.services import member_for_handle
from coordination import claims
from coordination.events import task_event
from coordination.models import TASK_CHANNEL_PREFIX, Task
from inbox.text import encode_text

TITLE_MAX = 200
DESCRIPTION_MAX = 8 * 1024
# Each task brings a discussion channel of its own, which the channel cap
# does not count: a member has at most this many unfinished tasks of their
# making in one space (done ones do not count: a long project makes many).
MAX_UNFINISHED_TASKS_PER_MEMBER = 1_000
RELATED = ("space", "conversation", "assignee", "reviewer", "claimant", "created_by")


def _text(value, field: str, limit: int, *, strip: bool = False) -> str:
    """A title or description: text (no NUL, no lone surrogate: 422) of at
    most `limit` bytes (400); a title must not be blank (400)."""
    if not isinstance(value, str):
        raise InvalidRequest(f"`{field}` is a string.", details={"field": field})
    value = value.strip() if strip else value
    if strip and not value:
        raise InvalidRequest(f"A task needs a {field}.", details={"field": field})
    if value:
        encode_text(value, field=field, max_bytes=limit, too_large=InvalidRequest)
    return value


def _member_of(space: Space, handle: str | None, field: str) -> Member | None:
    if handle is None:
        return None
    try:
        member = member_for_handle(handle)
        require_sender(space, member)  # moving a task takes a writer: one who is not could never act on it
    except (InvalidRequest, NotFound, Forbidden):
        raise InvalidRequest(f"`{field}` must be an active member of the space who may write in it.",
                             details={"field": field, "member": handle}) from None
    return member


def create_task(space: Space, *, title: str, description: str = "", assignee: str | None = None,
                reviewer: str | None = None, actor: Member) -> Task:
    require_sender(space, actor)
    title = _text(title, "title", TITLE_MAX, strip=True)
    description = _text(description, "description", DESCRIPTION_MAX)
    assignee_member, reviewer_member = _member_of(space, assignee, "assignee"), _member_of(space, reviewer,
                                                                                          "reviewer")
    with transaction.atomic():
        _require_room(space, actor.pk)
        task = Task(space=space, title=title, description=description, assignee=assignee_member,
                    reviewer=reviewer_member, created_by=actor)
        name = f"{TASK_CHANNEL_PREFIX}{task.public_id}"
        task.conversation = Conversation.objects.create(space=space, kind=Conversation.Kind.CHANNEL, name=name,
                                                        address=f"#{name}", created_by=actor)
        task.save()
        # announced as every channel is (SPEC §6), then the task that discusses in it
        append_events([conversation_created(task.conversation, [], actor=actor),
                       task_event("task.created", task, actor=actor)])
    return task


def _require_room(space: Space, creator_id: int) -> None:
    """Room for one more unfinished task of `creator_id`'s making in
    `space` (409 LIMIT_EXCEEDED): made, or reopened once done. Their turns
    serialize the count."""
    Member.take_turns(creator_id)
    unfinished = Task.objects.filter(space=space, created_by_id=creator_id).exclude(status=Task.Status.DONE).count()
    if unfinished >= MAX_UNFINISHED_TASKS_PER_MEMBER:
        raise LimitExceeded(f"A member has at most {MAX_UNFINISHED_TASKS_PER_MEMBER} unfinished tasks of their "
                            "making in a space; complete some first.",
                            details={"limit": MAX_UNFINISHED_TASKS_PER_MEMBER})


def space_tasks(space: Space, member: Member | None, status: str | None = None):
    """The space's tasks (in `status`), if `member` can read it: 404
    otherwise. Listing them sweeps their claims' expiry first (SPEC §10:
    reads sweep expiry), so expired work shows as open on hosts with no
    worker too."""
    if not can_read_space(space, member):
        raise NotFound()
    claims.expire_due_in(space)
    tasks = Task.objects.filter(space=space).select_related(*RELATED)
    return tasks.filter(status=status) if status else tasks


def visible_task(space: Space, task_id: str, member: Member | None, *, lock: bool = False) -> Task:
    """The task, if `member` can read its space: 404 otherwise. Reading a
    task sweeps its claim's expiry first (SPEC §10)."""
    if not can_read_space(space, member):
        raise NotFound()
    claims.expire_if_due(space, task_id)
    rows = Task.objects.filter(space=space, public_id=task_id)
    task = claims.locked_task(rows, RELATED) if lock else rows.select_related(*RELATED).first()
    if task is None:
        raise NotFound("No such task in this space.")
    return task


def _changed(task: Task, kind: str, actor: Member, fields: list[str]) -> Task:
    task.updated_at = now()
    claims.schedule(task)
    task.save(update_fields=[*fields, "updated_at", "sweep_at"])
    append_events([task_event(kind, task, actor=actor)])
    return task


# What a PATCH may change, with the column that holds it.
EDITABLE = {"title": "title", "description": "description", "assignee": "assignee_id", "reviewer": "reviewer_id"}


def update_task(space: Space, task_id: str, changes: dict, *, actor: Member) -> Task:
    require_sender(space, actor)
    with transaction.atomic():
        task = visible_task(space, task_id, actor, lock=True)
        if not (task.created_by_id == actor.pk or task.assignee_id == actor.pk or may_administer(space, actor)):
            raise Forbidden("Only the task's creator, its assignee or an admin of the space may change it.")
        before = {field: getattr(task, column) for field, column in EDITABLE.items()}
        if "title" in changes:
            task.title = _text(changes["title"], "title", TITLE_MAX, strip=True)
        if "description" in changes:
            task.description = _text(changes["description"], "description", DESCRIPTION_MAX)
        for field in ("assignee", "reviewer"):
            if field in changes:
                setattr(task, field, _member_of(space, changes[field], field))
        changed = [field for field, column in EDITABLE.items() if getattr(task, column) != before[field]]
        # What changes nothing writes nothing: no event, and the claim's silence is not restarted (SPEC §10).
        return _changed(task, "task.updated", actor, changed) if changed else task


def _conflict(task: Task, message: str) -> Conflict:
    return Conflict(message, details={"status": task.status,
                                      "claimant": f"@{task.claimant.handle}" if task.claimant else None})


def _claims_assigned(task: Task, actor: Member) -> bool:
    """A task with an assignee is claimed by them only (and by space admins)."""
    return task.assignee_id in (None, actor.pk)


def _decides(task: Task, actor: Member) -> bool:
    """The task's reviewer and its assignee (and space admins) complete and reopen it."""
    return actor.pk in (task.reviewer_id, task.assignee_id)


def may_move(task: Task, move: str, actor: Member, *, admin: bool) -> bool:
    """Whether `move` (claim, release, submit, complete, reopen) of
    `task` by `actor`, who may write in its space, would be taken now: the
    table of docs/tasks.md, from the same rules the moves below check, for
    pages that offer only what would be accepted. `admin`: `actor` may
    administer the space."""
    status, own = task.status, task.claimant_id == actor.pk
    return {
        "claim": status == Task.Status.OPEN and (admin or _claims_assigned(task, actor)),
        "release": status == Task.Status.CLAIMED and (admin or own),
        "submit": status == Task.Status.CLAIMED and own,
        "complete": status != Task.Status.DONE and (admin or _decides(task, actor)),
        "reopen": status in (Task.Status.IN_REVIEW, Task.Status.DONE) and (admin or _decides(task, actor)),
    }[move]


def _lock_claimant(space: Space, actor: Member) -> None:
    """`require_sender`, under the locks of `actor`'s member row and
    membership (the order a suspension and a removal take them in): a
    removal, demotion or suspension committing meanwhile is either seen
    here, or waits and then finds the claim, and lets it go
    (claims.look_at_claims_of). Checked before the task's lock only, a
    claim racing a removal was kept for 18 hours by a member who could
    neither submit nor release it."""
    Member.take_turns(actor.pk)
    membership = (Membership.objects.select_for_update(no_key=True)
                  .filter(space=space, member=actor, status=Membership.Status.ACTIVE).first())
    if not Member.objects.filter(pk=actor.pk, status=Member.Status.ACTIVE).exists():
        raise Forbidden("The member is suspended.")
    require_sender(space, actor, role=membership.role if membership is not None else None)


def claim_task(space: Space, task_id: str, *, actor: Member) -> Task:
    """Claim an open task, or one whose claim has expired (in the same
    request: the expiry is swept first). Claiming one's own claim again
    changes nothing."""
    require_sender(space, actor)  # refused before any lock is taken, as every move is
    with transaction.atomic():
        _lock_claimant(space, actor)
        task = visible_task(space, task_id, actor, lock=True)
        if task.status == Task.Status.CLAIMED and task.claimant_id == actor.pk:
            return task
        if task.status != Task.Status.OPEN:
            raise _conflict(task, "The task is not open: it is claimed by another member, in review, or done.")
        if not (_claims_assigned(task, actor) or may_administer(space, actor)):
            raise Forbidden("The task is assigned to another member.")
        task.status, task.claimant, task.claimed_at = Task.Status.CLAIMED, actor, now()
        return _changed(task, "task.claimed", actor, ["status", "claimant", "claimed_at"])


def release_task(space: Space, task_id: str, *, actor: Member) -> Task:
    require_sender(space, actor)
    with transaction.atomic():
        task = visible_task(space, task_id, actor, lock=True)
        if task.status != Task.Status.CLAIMED:
            raise _conflict(task, "Only a claimed task can be released.")
        if task.claimant_id != actor.pk and not may_administer(space, actor):
            raise Forbidden("Only the claimant or an admin of the space may release the task.")
        task.status, task.claimant, task.claimed_at = Task.Status.OPEN, None, None
        return _changed(task, "task.released", actor, ["status", "claimant", "claimed_at"])


def submit_task(space: Space, task_id: str, *, actor: Member) -> Task:
    require_sender(space, actor)
    with transaction.atomic():
        task = visible_task(space, task_id, actor, lock=True)
        if task.status != Task.Status.CLAIMED:
            raise _conflict(task, "Only a claimed task can be submitted for review.")
        if task.claimant_id != actor.pk:
            raise Forbidden("Only the claimant may submit the task.")
        task.status = Task.Status.IN_REVIEW
        return _changed(task, "task.submitted", actor, ["status"])


def _require_decider(task: Task, actor: Member) -> None:
    if not (_decides(task, actor) or may_administer(task.space, actor)):
        raise Forbidden("Only the task's reviewer, its assignee or an admin of the space may do this.")


def complete_task(space: Space, task_id: str, *, actor: Member) -> Task:
    require_sender(space, actor)
    with transaction.atomic():
        task = visible_task(space, task_id, actor, lock=True)
        _require_decider(task, actor)
        if task.status == Task.Status.DONE:
            raise _conflict(task, "The task is done already.")
        task.status = Task.Status.DONE
        return _changed(task, "task.completed", actor, ["status"])


def reopen_task(space: Space, task_id: str, *, actor: Member) -> Task:
    """Back to open, unclaimed: work sent back from review, or done work
    that was not."""
    require_sender(space, actor)
    with transaction.atomic():
        seen = visible_task(space, task_id, actor)
        if seen.status == Task.Status.DONE:
            # Done work reopened counts against its creator's unfinished tasks, as a new
            # one does: the creator's turn first, before the task's lock (create_task's order).
            _require_decider(seen, actor)
            _require_room(space, seen.created_by_id)
        task = visible_task(space, task_id, actor, lock=True)
        _require_decider(task, actor)
        if task.status not in (Task.Status.IN_REVIEW, Task.Status.DONE):
            raise _conflict(task, "Only a task in review or done can be reopened.")
        task.status, task.claimant, task.claimed_at = Task.Status.OPEN, None, None
        return _changed(task, "task.reopened", actor, ["status", "claimant", "claimed_at"])
