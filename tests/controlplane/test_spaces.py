"""SPEC §3: members, spaces, memberships, conversations."""
import pytest

from controlplane import bearer, services
from controlplane.clock import rfc3339
from controlplane.errors import InvalidRequest
from controlplane.models import Event, Member, Membership, Space
from tests.conftest import error_code


def kinds_since(position: int) -> list[str]:
    return list(Event.objects.filter(position__gt=position).order_by("position").values_list("kind", flat=True))


def test_me(as_alice, alice, django_assert_num_queries):
    # one query: the credential with every column of its member (none left to load on its own)
    with django_assert_num_queries(1):
        member = as_alice.get("/v0/me").json()["member"]
    assert member["handle"] == "@alice" and member["id"].startswith("mem_")
    assert member["kind"] == "agent" and member["status"] == "active"
    assert member["created_at"] == rfc3339(alice.created_at)


@pytest.mark.parametrize("kind, password, told", [
    ("human", "short", "This password is too short."),
    ("agent", "long-enough-password", "no password for this member"),
])
def test_a_members_password_passes_the_validators_and_is_only_for_those_who_sign_in(db, kind, password, told):
    # createmember --password-stdin took any password, and an agent's went nowhere, silently
    with pytest.raises(InvalidRequest) as refused:
        services.create_member("dana", kind=kind, password=password, actor=None)
    assert told in refused.value.message and not Member.objects.filter(handle="dana").exists()


@pytest.mark.parametrize("name", ["   ", "\t", "\u00a0", "too long", "bad\udcffname", "nul\x00", "two\nlines",
                                  "tab\there", "ada\u202egnp.exe", "isolated\u2067name\u2069", "ab\u2028cd",
                                  "ab\u2029cd"])
def test_a_name_is_checked_where_it_is_stored_whoever_gives_it(db, alice, name):
    """createmember's display name went to the database unchecked (a 300-character
    one was stored on SQLite and a traceback on PostgreSQL), and the API stored a
    space's name of spaces only, which the web form refused. A name with a
    right-to-left override showed the names after it reversed in every list."""
    def given(longest: int) -> str:
        return "x" * (longest + 1) if name == "too long" else name

    for make in (lambda: services.create_member("dana", display_name=given(200), actor=None),
                 lambda: services.create_space(slug="lab", name=given(200), visibility="open", send_policy="open",
                                               actor=alice),
                 lambda: bearer.issue_credential(alice, actor=alice, name=given(100))):
        with pytest.raises(InvalidRequest):
            make()
    assert not Member.objects.filter(handle="dana").exists() and not Space.objects.exists()
    assert not alice.credentials.exists()


def test_a_right_to_left_name_keeps_its_direction_marks(db, alice):
    name = "\u05e9\u05dc\u05d5\u05dd\u200f (RTL)"
    assert services.create_space(slug="lab", name=name, visibility="open", send_policy="open",
                                 actor=alice).name == name
    assert services.create_member("dana", display_name=name, actor=None).display_name == name


def test_a_space_named_with_spaces_only_is_refused_by_the_api_as_by_the_web_form(as_alice):
    refused = as_alice.post("/v0/spaces", {"slug": "lab", "name": "   "})
    assert refused.status_code == 400 and error_code(refused) == "INVALID_REQUEST"
    assert refused.json()["error"]["details"] == {"field": "name"} and not Space.objects.exists()


def test_only_admins_create_members(api_for, make_member, as_alice):
    # given
    admin = api_for(make_member("root", is_admin=True))
    # when
    denied = as_alice.post("/v0/members", {"handle": "dave"})
    created = admin.post("/v0/members", {"handle": "dave", "kind": "operator"})
    taken = admin.post("/v0/members", {"handle": "dave"})
    bad = admin.post("/v0/members", {"handle": "-nope"})
    # then
    assert denied.status_code == 403 and error_code(denied) == "FORBIDDEN"
    assert created.status_code == 201 and created.json()["member"]["kind"] == "operator"
    assert taken.status_code == 409 and error_code(taken) == "CONFLICT"
    assert bad.status_code == 400
    assert Member.objects.filter(handle="dave").count() == 1


def test_create_space_makes_creator_owner(as_alice, alice):
    # when
    response = as_alice.post("/v0/spaces", {"slug": "lab", "name": "Lab", "visibility": "request",
                                            "send_policy": "explicit_only"})
    # then
    assert response.status_code == 201
    space = response.json()["space"]
    assert space == {"id": space["id"], "slug": "lab", "name": "Lab", "visibility": "request",
                     "send_policy": "explicit_only", "archived": False}
    assert Membership.objects.get(space__slug="lab", member=alice).role == "owner"
    assert kinds_since(0) == ["space.created", "member.joined"]
    assert as_alice.post("/v0/spaces", {"slug": "lab", "name": "Again"}).status_code == 409


def test_open_space_join_is_immediate(space, make_member, api_for):
    # given
    dave = make_member("dave")
    before = Event.objects.count()
    # when
    response = api_for(dave).post("/v0/spaces/lab/join")
    again = api_for(dave).post("/v0/spaces/lab/join")
    # then
    assert response.json()["membership"]["status"] == "active"
    assert again.json()["membership"]["status"] == "active"
    assert Event.objects.count() == before + 1


def test_request_space_join_waits_for_an_owner(as_alice, alice, make_member, api_for):
    # given
    as_alice.post("/v0/spaces", {"slug": "club", "name": "Club", "visibility": "request"})
    dave = make_member("dave")
    as_dave = api_for(dave)
    # when
    asked = as_dave.post("/v0/spaces/club/join")
    # then
    assert asked.json()["membership"]["status"] == "pending"
    assert as_dave.get("/v0/spaces/club/events").status_code == 404
    owners_view = as_alice.get("/v0/spaces/club/members").json()["members"]
    assert {"@dave": "pending"}.items() <= {m["member"]: m["status"] for m in owners_view}.items()
    # when an owner admits
    admitted = as_alice.post("/v0/spaces/club/members", {"member": "@dave"})
    # then
    assert admitted.json()["membership"]["status"] == "active"
    assert as_dave.get("/v0/spaces/club/events").status_code == 200


def test_private_space_is_invisible_to_outsiders(as_alice, as_bob, anon):
    # given
    as_alice.post("/v0/spaces", {"slug": "vault", "name": "Vault", "visibility": "private"})
    # then
    for api in (as_bob, anon):
        assert api.get("/v0/spaces/vault").status_code == 404
        assert api.get("/v0/spaces/vault/events").status_code == 404
        assert api.get("/v0/spaces/vault/members").status_code == 404
    assert as_bob.post("/v0/spaces/vault/join").status_code == 404
    # when an owner adds bob
    assert as_alice.post("/v0/spaces/vault/members", {"member": "@bob", "role": "observer"}).status_code == 201
    # then
    assert as_bob.get("/v0/spaces/vault").status_code == 200
    # and joining it, as its members may ask any space, is the same no-op as elsewhere (it was a 404)
    for api, role in ((as_alice, "owner"), (as_bob, "observer")):
        again = api.post("/v0/spaces/vault/join")
        assert again.status_code == 200 and again.json()["membership"]["role"] == role
    # but not for one removed since
    assert as_alice.delete("/v0/spaces/vault/members/bob").status_code == 204
    assert as_bob.post("/v0/spaces/vault/join").status_code == 404


def test_only_owners_add_and_remove(space, as_bob, as_carol, as_alice):
    assert error_code(as_bob.post("/v0/spaces/lab/members", {"member": "@carol", "role": "owner"})) == "FORBIDDEN"
    assert error_code(as_bob.delete("/v0/spaces/lab/members/carol")) == "FORBIDDEN"
    assert as_carol.delete("/v0/spaces/lab/members/carol").status_code == 204  # leaving is always allowed
    assert as_alice.delete("/v0/spaces/lab/members/bob").status_code == 204
    assert as_alice.delete("/v0/spaces/lab/members/bob").status_code == 404
    last_owner = as_alice.delete("/v0/spaces/lab/members/alice")
    assert last_owner.status_code == 409


def test_only_owners_learn_that_a_member_they_would_add_is_suspended(space, as_bob, as_alice, make_member):
    Member.objects.filter(pk=make_member("hopper").pk).update(status=Member.Status.SUSPENDED)
    refused = as_bob.post("/v0/spaces/lab/members", {"member": "@hopper"})
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"  # as for anyone else
    told = as_alice.post("/v0/spaces/lab/members", {"member": "@hopper"})
    assert told.status_code == 409 and error_code(told) == "CONFLICT"


def test_anonymous_reads_open_space_metadata_only(space, anon):
    assert anon.get("/v0/spaces/lab").status_code == 200
    assert anon.get("/v0/spaces/lab/members").status_code == 200
    assert anon.get("/v0/spaces/lab/events").status_code == 200
    assert anon.post("/v0/spaces/lab/join").status_code == 401
    assert anon.post("/v0/spaces", {"slug": "x", "name": "x"}).status_code == 401


def test_anonymous_callers_see_open_spaces_only(as_alice, anon):
    as_alice.post("/v0/spaces", {"slug": "club", "name": "Club", "visibility": "request"})
    assert anon.get("/v0/spaces/club").status_code == 404
    assert anon.get("/v0/spaces/club/members").status_code == 404


def test_join_answers_201_when_it_creates_a_membership(space, make_member, api_for):
    as_dave = api_for(make_member("dave"))
    assert as_dave.post("/v0/spaces/lab/join").status_code == 201
    assert as_dave.post("/v0/spaces/lab/join").status_code == 200


def test_a_space_keeps_an_owner_through_demotion(space, as_alice):
    # when: the only owner demotes themself
    response = as_alice.post("/v0/spaces/lab/members", {"member": "@alice", "role": "observer"})
    # then
    assert response.status_code == 409 and error_code(response) == "CONFLICT"
    assert Membership.objects.get(space=space, member__handle="alice").role == "owner"
    # when another owner exists, demotion is fine
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@bob", "role": "owner"}).status_code == 200
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@alice", "role": "member"}).status_code == 200


def test_a_suspended_owner_is_no_owner_the_space_keeps(space, as_alice, bob):
    # given: bob an owner, then suspended
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@bob", "role": "owner"}).status_code == 200
    services.update_member(bob, status="suspended", actor=None)
    # when: alice, the only owner who may act, leaves or steps down
    for refused in (as_alice.delete("/v0/spaces/lab/members/@alice"),
                    as_alice.post("/v0/spaces/lab/members", {"member": "@alice", "role": "member"})):
        # then
        assert refused.status_code == 409 and error_code(refused) == "CONFLICT"
    assert Membership.objects.get(space=space, member__handle="alice").role == "owner"


def test_leaving_and_joining_again_undoes_no_demotion(space, as_alice, as_bob, as_carol, general):
    """An observer of an open space left it and joined again as a member,
    undoing the owner's demotion; an owner who leaves gives up the role."""
    # given: bob made an observer, carol an owner (alice stays one)
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@bob", "role": "observer"}).status_code == 200
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@carol", "role": "owner"}).status_code == 200
    for api, handle in ((as_bob, "@bob"), (as_carol, "@carol")):
        # when: each leaves and joins again
        assert api.delete(f"/v0/spaces/lab/members/{handle}").status_code == 204
        joined = api.post("/v0/spaces/lab/join")
        assert joined.status_code == 201 and joined.json()["membership"]["status"] == "active"
    # then
    roles = dict(Membership.objects.filter(space=space).values_list("member__handle", "role"))
    assert (roles["bob"], roles["carol"]) == ("observer", "member")
    refused = as_bob.post("/v0/spaces/lab/conversations/%23general/messages", {"body": "back with a voice?"})
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"


def test_adding_a_member_without_a_role_keeps_an_active_members_role(space, make_member, as_alice, alice):
    # given: bob an owner, eve an observer
    services.add_member(space, make_member("eve"), role="observer", actor=alice)
    as_alice.post("/v0/spaces/lab/members", {"member": "@bob", "role": "owner"})
    # when: posted again with no role
    for handle in ("bob", "eve"):
        response = as_alice.post("/v0/spaces/lab/members", {"member": f"@{handle}"})
        assert response.status_code == 200
    # then: nothing changed; a newcomer with no role joins as a member
    roles = dict(Membership.objects.filter(space=space).values_list("member__handle", "role"))
    assert (roles["bob"], roles["eve"]) == ("owner", "observer")
    make_member("zed")
    assert as_alice.post("/v0/spaces/lab/members", {"member": "@zed"}).json()["membership"]["role"] == "member"


def test_credentials_are_capped(as_alice, settings):
    settings.CREDENTIALS_PER_HOUR = 0  # the cap, not the hourly limit, is under test
    statuses = [as_alice.post("/v0/me/credentials").status_code for _ in range(20)]
    assert statuses == [201] * 19 + [409]
    assert error_code(as_alice.post("/v0/me/credentials")) == "LIMIT_EXCEEDED"


@pytest.mark.parametrize("limit", ["1.0", "1_0", " 1", "+1", "１"])
def test_query_integers_are_plain_digits(space, as_alice, limit):
    response = as_alice.get("/v0/spaces/lab/conversations", limit=limit)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"


def test_my_spaces_lists_memberships_and_requests_in_pages(space, as_alice, as_bob, as_carol, anon):
    # given: bob is in lab, asks to join club, leaves attic; alice owns all three
    as_alice.post("/v0/spaces", {"slug": "club", "name": "Club", "visibility": "request"})
    as_alice.post("/v0/spaces", {"slug": "attic", "name": "Attic"})
    as_bob.post("/v0/spaces/club/join")
    as_bob.post("/v0/spaces/attic/join")
    as_bob.delete("/v0/spaces/attic/members/bob")
    # when
    first = as_bob.get("/v0/me/spaces", limit=1).json()
    second = as_bob.get("/v0/me/spaces", limit=1, cursor=first["cursor"]).json()
    # then
    assert first["has_more"] and not second["has_more"]
    assert [(s["slug"], s["role"], s["status"]) for s in first["spaces"] + second["spaces"]] == [
        ("lab", "member", "active"), ("club", "member", "pending")]
    assert second["spaces"][0] == {"id": second["spaces"][0]["id"], "slug": "club", "name": "Club",
                                   "visibility": "request", "send_policy": "open", "archived": False,
                                   "role": "member", "status": "pending"}
    assert [s["slug"] for s in as_alice.get("/v0/me/spaces").json()["spaces"]] == ["lab", "club", "attic"]
    # and a cursor is its caller's own; anonymous callers have no spaces
    assert error_code(as_carol.get("/v0/me/spaces", cursor=first["cursor"])) == "INVALID_CURSOR"
    assert anon.get("/v0/me/spaces").status_code == 401


@pytest.mark.parametrize("field, value", [("visibility", "secret"), ("send_policy", "anyone")])
def test_the_space_service_refuses_an_unknown_visibility_or_send_policy_whoever_calls(alice, field, value):
    # given: the fields a caller that skipped the API's parsing might pass
    fields = {"visibility": "open", "send_policy": "open", field: value}
    # when / then: refused, and nothing made
    with pytest.raises(InvalidRequest) as refused:
        services.create_space(slug="lab", name="Lab", actor=alice, **fields)
    assert refused.value.details == {field: value}
    assert not Space.objects.exists()


def test_a_member_creates_so_many_spaces_and_an_admin_more(monkeypatch, alice, as_alice, make_member):
    # given
    monkeypatch.setattr(services, "MAX_SPACES_PER_MEMBER", 2)
    for slug in ("one", "two"):
        assert as_alice.post("/v0/spaces", {"slug": slug, "name": slug}).status_code == 201
    # when
    refused = as_alice.post("/v0/spaces", {"slug": "three", "name": "three"})
    # then: 409 LIMIT_EXCEEDED, nothing made; archiving one makes room
    assert error_code(refused) == "LIMIT_EXCEEDED" and not Space.objects.filter(slug="three").exists()
    Space.objects.filter(slug="one").update(archived=True)
    assert as_alice.post("/v0/spaces", {"slug": "three", "name": "three"}).status_code == 201
    admin = make_member("root", is_admin=True)
    for slug in ("four", "five", "six"):
        services.create_space(slug=slug, name=slug, visibility="open", send_policy="open", actor=admin)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_owners_changing_each_others_memberships_at_once_never_deadlock():
    """Which rows are a space's owners changes as each change commits, so
    locking the owners' rows in id order was no single order: two owners
    demoting, promoting and removing each other at once deadlocked, and
    PostgreSQL broke the cycle after a second with an error (503)."""
    import random
    import threading

    from django.db import OperationalError, connections

    from controlplane.errors import ApiError

    handles = ["alice", "bob", "carol", "dave"]
    members = [services.create_member(h, actor=None) for h in handles]
    space = services.create_space(slug="lab", name="Lab", visibility="private", send_policy="open", actor=members[0])
    for member in members[1:]:
        services.add_member(space, member, role="owner", actor=members[0])
    failures, start = [], threading.Barrier(len(members))

    def churn(index: int):
        chance, actor = random.Random(index), Member.objects.get(pk=members[index].pk)
        try:
            start.wait(10)
            for _ in range(40):
                other = chance.choice([m for m in members if m.pk != actor.pk])
                try:
                    if chance.random() < 0.2:
                        services.remove_member(space, other, actor=actor)
                    else:
                        services.add_member(space, other, role=chance.choice(["owner", "member"]), actor=actor)
                except ApiError:
                    pass  # not an owner just now, or the last one: refusals are the point
                except OperationalError as exc:
                    failures.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert Membership.objects.filter(space=space, role="owner", status="active").exists()
