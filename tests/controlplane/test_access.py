"""The read rule (controlplane.access) gives one answer on every path: one
object, querysets, sets of members, and the send path's plain SQL, over a
matrix of spaces, roles, membership states and conversations."""
from __future__ import annotations

import itertools

import pytest

from controlplane import access, services
from controlplane.errors import NotFound
from controlplane.models import Conversation, Member, Membership, Space
from inbox.models import Message
from inbox.services import send_message

# (handle, role, membership status or None, member suspended)
PEOPLE = [
    ("own", Membership.Role.OWNER, Membership.Status.ACTIVE, False),
    ("mem", Membership.Role.MEMBER, Membership.Status.ACTIVE, False),
    ("obs", Membership.Role.OBSERVER, Membership.Status.ACTIVE, False),
    ("ask", Membership.Role.MEMBER, Membership.Status.PENDING, False),
    ("gone", Membership.Role.MEMBER, Membership.Status.REMOVED, False),
    ("sus", Membership.Role.MEMBER, Membership.Status.ACTIVE, True),
    ("out", None, None, False),
]
SPACES = [("open", False), ("request", False), ("private", False), ("private", True)]  # (visibility, archived)


def _expected(member: Member | None, conversation: Conversation, memberships: dict, participants: dict) -> bool:
    """The rule as SPEC §3 words it, written out independently."""
    space = conversation.space
    if member is None:
        return space.visibility == Space.Visibility.OPEN and conversation.kind == Conversation.Kind.CHANNEL
    if member.status != Member.Status.ACTIVE:
        return False
    in_space = (space.visibility == Space.Visibility.OPEN
                or memberships.get((space.pk, member.pk)) == Membership.Status.ACTIVE)
    takes_part = conversation.kind == Conversation.Kind.CHANNEL or member.pk in participants[conversation.pk]
    return in_space and takes_part


@pytest.fixture
def matrix(db, make_member):
    """Four spaces, each with a channel, a direct conversation of the owner
    and every other person, and a group of everyone, a message in each; then
    the membership states and suspensions applied."""
    people = {handle: make_member(f"{handle}") for handle, *_ in PEOPLE}
    conversations, memberships, participants = [], {}, {}
    for i, (visibility, archived) in enumerate(SPACES):
        owner = people["own"]
        space = services.create_space(slug=f"s{i}-{visibility}", name=f"S{i}", visibility=visibility,
                                      send_policy="open", actor=owner)
        for handle, role, status, _ in PEOPLE[1:]:
            if status is not None:
                services.add_member(space, people[handle], role=Membership.Role.MEMBER, actor=owner)
        channel = services.create_channel(space, "general", actor=owner)
        members = [people[h] for h, _, status, _ in PEOPLE if status is not None]
        group, _ = services.get_or_create_group(space, members, actor=owner)
        directs = [services.get_or_create_direct(space, m, actor=owner)[0] for m in members[1:]]
        for conversation in [channel, group, *directs]:
            send_message(conversation, body="hello", actor=owner)
            conversations.append(conversation)
            participants[conversation.pk] = set(conversation.participants.values_list("member_id", flat=True))
        for handle, role, status, _ in PEOPLE:
            if status is not None:
                Membership.objects.filter(space=space, member=people[handle]).update(role=role, status=status)
                memberships[(space.pk, people[handle].pk)] = status
        # the policy changes nothing of who reads; conversation_readers returns it
        policy = Space.SendPolicy.EXPLICIT_ONLY if i % 2 else Space.SendPolicy.OPEN
        Space.objects.filter(pk=space.pk).update(archived=archived, send_policy=policy)
    Member.objects.filter(pk=people["sus"].pk).update(status=Member.Status.SUSPENDED)
    readers = [Member.objects.get(pk=m.pk) for m in people.values()] + [None]
    conversations = list(Conversation.objects.select_related("space").filter(pk__in=[c.pk for c in conversations]))
    return readers, conversations, memberships, participants


def test_every_read_path_agrees_with_the_rule(matrix):
    # given
    readers, conversations, memberships, participants = matrix
    pks = {m.pk for m in readers if m is not None}
    # when: the set-of-members paths, once for everyone
    per_conversation = {c.pk: access.readers_of(c, pks) for c in conversations}
    together = access.readers_of_conversations({c.pk for c in conversations}, pks)
    live = {c.pk: access.conversation_readers(c.pk, pks) for c in conversations}
    checked = 0
    for member, conversation in itertools.product(readers, conversations):
        expected = _expected(member, conversation, memberships, participants)
        space = conversation.space
        answers = {
            "readable_spaces + readable_conversations":
                access.readable_spaces(member).filter(pk=space.pk).exists()
                and access.readable_conversations(space, member).filter(pk=conversation.pk).exists(),
            "can_read_space": access.can_read_space(space, member)
                and access.readable_conversations(space, member).filter(pk=conversation.pk).exists(),
            "Message.visible_to": Message.objects.visible_to(member).filter(conversation=conversation).exists(),
        }
        if member is not None:
            answers["readable_conversation"] = access.readable_conversation(member, conversation.public_id) is not None
            answers["readers_of"] = member.pk in per_conversation[conversation.pk]
            answers["readers_of_conversations"] = member.pk in together.get(conversation.pk, set())
            answers["conversation_readers"] = member.pk in live[conversation.pk][0]
            refs = [conversation.public_id] + ([f"#{conversation.name}"] if conversation.name else [])
            for ref in refs:
                try:
                    access.get_conversation_to_write(space.slug, ref, member)
                    answers[f"get_conversation_to_write({ref[:1]})"] = True
                except NotFound:
                    answers[f"get_conversation_to_write({ref[:1]})"] = False
        # then
        wrong = {path: answer for path, answer in answers.items() if answer != expected}
        assert not wrong, (f"{member.handle if member else 'anonymous'} on {conversation.kind} in "
                           f"{space.visibility}{' archived' if space.archived else ''}: expected {expected}, "
                           f"got {wrong}")
        checked += 1
    assert checked == len(readers) * len(conversations) == 8 * 4 * 7
    policies = {c.pk: c.space.send_policy for c in conversations}
    assert {pk: policy for pk, (_, policy) in live.items()} == policies
    assert set(policies.values()) == {Space.SendPolicy.OPEN, Space.SendPolicy.EXPLICIT_ONLY}


def test_delivery_from_a_space_follows_reading_less_removal(matrix):
    """`receives_from` (wakes) and `removed_sql` (mentions) give the
    delivery rule: a space delivers to who reads it, less who was removed
    from it, in an open space too."""
    from django.db import connection

    readers, conversations, memberships, _ = matrix
    spaces = {c.space_id: c.space for c in conversations}
    answers = {}
    for member, space in itertools.product([m for m in readers if m is not None], spaces.values()):
        status = memberships.get((space.pk, member.pk))
        reads = member.status == Member.Status.ACTIVE and (space.visibility == Space.Visibility.OPEN
                                                           or status == Membership.Status.ACTIVE)
        expected = reads and status != Membership.Status.REMOVED
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {access.removed_sql('%s', '%s')}", [space.pk, member.pk])
            removed = bool(cursor.fetchone()[0])
            # and `receiving_sql` (space subscriptions' wakes), which leaves the member's own status to its caller
            cursor.execute(f"SELECT {access.receiving_sql(str(space.pk), str(member.pk))}")
            receiving = bool(cursor.fetchone()[0])
        assert access.receives_from(space, member) == expected == (reads and not removed), (member.handle, space.slug)
        as_if_active = ((space.visibility == Space.Visibility.OPEN or status == Membership.Status.ACTIVE)
                        and status != Membership.Status.REMOVED)
        assert receiving == as_if_active, (member.handle, space.slug)
        answers[(member.handle, space.visibility)] = expected
    assert answers[("gone", "open")] is False and answers[("out", "open")] is True


def test_conversation_readers_of_nobody_or_of_a_missing_conversation(matrix):
    readers, conversations, *_ = matrix
    conversation = conversations[0]
    Space.objects.filter(pk=conversation.space_id).update(send_policy=Space.SendPolicy.EXPLICIT_ONLY)
    # the space's policy comes back even when no member is asked about
    assert access.conversation_readers(conversation.pk, set()) == (set(), Space.SendPolicy.EXPLICIT_ONLY)
    # a conversation that is gone has no readers and no policy
    missing = max(c.pk for c in conversations) + 1
    assert access.conversation_readers(missing, {m.pk for m in readers if m is not None}) == (set(), None)


def test_the_matrix_has_both_answers_in_every_kind_of_space(matrix):
    # A matrix where everything reads (or nothing does) would prove little.
    readers, conversations, memberships, participants = matrix
    for space_id in {c.space_id for c in conversations}:
        answers = {_expected(m, c, memberships, participants)
                   for m in readers for c in conversations if c.space_id == space_id}
        assert answers == {True, False}


def test_visible_memberships_show_pending_requests_to_owners_only(matrix):
    readers, conversations, *_ = matrix
    by_handle = {m.handle: m for m in readers if m is not None}
    space = next(c.space for c in conversations if c.space.visibility == Space.Visibility.REQUEST)
    # when
    for_owner = {m.member.handle for m in access.visible_memberships(space, by_handle["own"])}
    for_member = {m.member.handle for m in access.visible_memberships(space, by_handle["mem"])}
    # then
    assert for_owner == {"own", "mem", "obs", "ask", "sus"}
    assert for_member == {"own", "mem", "obs", "sus"}


def test_a_suspended_member_is_put_in_no_new_conversation(space, alice, bob, carol, as_alice):
    # given: alice's direct conversation with carol, then carol suspended
    before = as_alice.post("/v0/spaces/lab/direct", {"member": "@carol"}).json()["conversation"]["id"]
    services.update_member(carol, status="suspended", actor=None)
    # when / then: the one there is still alice's to open; no new one takes carol in,
    # as adding her to a space does not (it was 201)
    again = as_alice.post("/v0/spaces/lab/direct", {"member": "@carol"})
    assert again.status_code == 200 and again.json()["conversation"]["id"] == before
    group = as_alice.post("/v0/spaces/lab/groups", {"members": ["@alice", "@bob", "@carol"]})
    assert group.status_code == 409 and group.json()["error"]["details"]["members"] == ["@carol"]
    assert not Conversation.objects.filter(kind=Conversation.Kind.GROUP).exists()


def test_the_hosts_admins_list_the_members_of_a_space_they_manage(alice, make_member, api_for):
    # given: a request space with a pending request, and an admin who belongs to none of it
    space = services.create_space(slug="desk", name="Desk", visibility="request", send_policy="open", actor=alice)
    services.join_space(space, actor=make_member("asker"))
    as_root = api_for(make_member("root", kind="human", is_admin=True))
    # when
    listed = as_root.get("/v0/spaces/desk/members")
    # then: the admin sees what they may admit (they could add @asker, and list nobody: 404)
    assert listed.status_code == 200
    assert sorted((m["member"], m["status"]) for m in listed.json()["members"]) == [
        ("@alice", "active"), ("@asker", "pending")]


def test_an_archived_space_keeps_its_memberships_and_conversations_to_open(space, alice, bob, as_alice, as_bob):
    # given: alice's direct conversation with bob, then the space archived
    before = as_alice.post("/v0/spaces/lab/direct", {"member": "@bob"}).json()["conversation"]["id"]
    Space.objects.filter(pk=space.pk).update(archived=True)
    # when / then: joining again and opening the conversation change nothing, and say so (200);
    # a new conversation is refused
    assert as_bob.post("/v0/spaces/lab/join").status_code == 200
    opened = as_bob.post("/v0/spaces/lab/direct", {"member": "@alice"})
    assert opened.status_code == 200 and opened.json()["conversation"]["id"] == before
    refused = as_bob.post("/v0/spaces/lab/direct", {"member": "@carol"})
    assert refused.status_code == 409 and refused.json()["error"]["message"] == "The space is archived."


def test_an_archived_space_takes_no_new_member_and_no_new_grant(space, alice, bob, make_member, as_alice):
    """Joining was refused while an owner could still add anyone, and make
    grants that authorize nothing but woke their parties' receivers."""
    # given: a grant made before the space was archived
    from controlplane.models import Membership

    make_member("dana")
    grant = {"id": "grt_before", "kind": "pair", "sender": "@bob", "recipient": "@alice"}
    assert as_alice.post("/v0/spaces/lab/grants", grant).status_code == 201
    Space.objects.filter(pk=space.pk).update(archived=True)
    # when / then: adding someone new, or a new grant, is refused and changes nothing
    added = as_alice.post("/v0/spaces/lab/members", {"member": "@dana"})
    assert (added.status_code, added.json()["error"]["message"]) == (409, "The space is archived.")
    assert not Membership.objects.filter(space=space, member__handle="dana").exists()
    created = as_alice.post("/v0/spaces/lab/grants", {**grant, "id": "grt_after"})
    assert (created.status_code, created.json()["error"]["message"]) == (409, "The space is archived.")
    # and: what is already there answers as before
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@bob"}).status_code == 200
    assert as_alice.post("/v0/spaces/lab/grants", grant).status_code == 200


def test_who_may_not_write_or_manage_learns_nothing_of_which_handles_exist(space, alice, make_member, api_for):
    # given: dave, in no space of alice's; an observer of lab and a stranger to it (anyone reads an open space)
    make_member("dave")
    observer, stranger = make_member("obs"), make_member("stranger")
    services.add_member(space, observer, role="observer", actor=alice)

    def answers(api, handle):
        return [(r.status_code, r.json()["error"]["code"]) for r in (
            api.post("/v0/spaces/lab/direct", {"member": handle}),
            api.post("/v0/spaces/lab/groups", {"members": [f"@{api.member.handle}", handle]}),
            api.post("/v0/spaces/lab/members", {"member": handle}),
            api.delete(f"/v0/spaces/lab/members/{handle}"))]

    # then: a handle someone holds and one no one does get the same answers (it was 404 "No such member" for
    # the second, and 400 or 403 for the first)
    for api in (api_for(observer), api_for(stranger)):
        assert answers(api, "@dave") == answers(api, "@nobody-at-all") == [
            (403, "FORBIDDEN"), (403, "FORBIDDEN"), (403, "FORBIDDEN"), (403, "FORBIDDEN")]
