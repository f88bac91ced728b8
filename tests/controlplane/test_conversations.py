"""SPEC §3: conversations (channels, direct messages, groups) and their caps."""
import pytest

from controlplane import services
from controlplane.models import Conversation
from tests.conftest import error_code, someone_waits_for_a_lock


def test_channel_conversation(space, as_bob):
    # when
    created = as_bob.post("/v0/spaces/lab/channels", {"name": "general"})
    duplicate = as_bob.post("/v0/spaces/lab/channels", {"name": "#general"})
    bad = as_bob.post("/v0/spaces/lab/channels", {"name": "Bad Name"})
    # then
    conversation = created.json()["conversation"]
    assert created.status_code == 201
    assert conversation == {"id": conversation["id"], "kind": "channel", "space": "lab", "name": "#general"}
    assert duplicate.status_code == 409 and bad.status_code == 400


def test_direct_conversation_is_one_per_pair(space, as_alice, as_bob):
    # when
    first = as_alice.post("/v0/spaces/lab/direct", {"member": "@bob"})
    second = as_bob.post("/v0/spaces/lab/direct", {"member": "alice"})
    # then
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["conversation"]["id"] == second.json()["conversation"]["id"]
    assert first.json()["conversation"]["kind"] == "direct"
    assert sorted(first.json()["conversation"]["members"]) == ["@alice", "@bob"]
    assert as_alice.post("/v0/spaces/lab/direct", {"member": "@alice"}).status_code == 400
    nobody = as_alice.post("/v0/spaces/lab/direct", {"member": "@nobody"})  # as one not in the space
    assert nobody.status_code == 400 and nobody.json()["error"]["details"]["members"] == ["@nobody"]


def test_group_keeps_its_exact_order(space, as_alice):
    # when
    created = as_alice.post("/v0/spaces/lab/groups", {"members": ["@carol", "@alice", "@bob"]})
    same = as_alice.post("/v0/spaces/lab/groups", {"members": ["@carol", "@alice", "@bob"]})
    reordered = as_alice.post("/v0/spaces/lab/groups", {"members": ["@alice", "@bob", "@carol"]})
    # then
    assert created.status_code == 201 and same.status_code == 200
    assert created.json()["conversation"]["members"] == ["@carol", "@alice", "@bob"]
    assert reordered.json()["conversation"]["id"] != created.json()["conversation"]["id"]


@pytest.mark.parametrize("members", [["@bob", "@carol"], ["@alice", "@alice", "@bob"], ["@alice"], "@bob",
                                     ["@alice", "@outsider"]])
def test_group_rejects_bad_member_lists(space, as_alice, make_member, members):
    make_member("outsider")
    before = Conversation.objects.count()
    response = as_alice.post("/v0/spaces/lab/groups", {"members": members})
    assert response.status_code == 400
    assert Conversation.objects.count() == before


def test_observers_cannot_write(space, make_member, api_for, as_alice):
    # given
    eve = make_member("eve")
    as_alice.post("/v0/spaces/lab/members", {"member": "@eve", "role": "observer"})
    # then
    response = api_for(eve).post("/v0/spaces/lab/channels", {"name": "eves"})
    assert response.status_code == 403


def test_list_channels_hides_others_direct_conversations(space, general, as_alice, as_carol, alice, bob):
    # given
    services.get_or_create_direct(space, bob, actor=alice)
    # when
    alices = {c["kind"] for c in as_alice.get("/v0/spaces/lab/conversations").json()["conversations"]}
    carols = {c["kind"] for c in as_carol.get("/v0/spaces/lab/conversations").json()["conversations"]}
    # then
    assert alices == {"channel", "direct"}
    assert carols == {"channel"}


def test_conversation_list_pages_with_cursor(space, as_alice, alice):
    for i in range(5):
        services.create_channel(space, f"c{i}", actor=alice)
    first = as_alice.get("/v0/spaces/lab/conversations", limit=2).json()
    second = as_alice.get("/v0/spaces/lab/conversations", limit=2, cursor=first["cursor"]).json()
    assert first["has_more"] and len(first["conversations"]) == 2
    assert {c["id"] for c in first["conversations"]}.isdisjoint(c["id"] for c in second["conversations"])
    assert as_alice.get("/v0/spaces/lab/conversations", limit=101).status_code == 400


def test_a_space_has_so_many_channels(monkeypatch, space, as_bob):
    # given: tasks' discussions are channels too, and do not count
    monkeypatch.setattr(services, "MAX_CHANNELS_PER_SPACE", 2)
    for n in range(3):
        assert as_bob.post("/v0/spaces/lab/tasks", {"title": f"t{n}"}).status_code == 201
    for name in ("one", "two"):
        assert as_bob.post("/v0/spaces/lab/channels", {"name": name}).status_code == 201
    # when
    refused = as_bob.post("/v0/spaces/lab/channels", {"name": "three"})
    # then
    assert error_code(refused) == "LIMIT_EXCEEDED"
    assert not Conversation.objects.filter(space=space, name="three").exists()


def test_a_member_makes_so_many_groups_in_a_space(monkeypatch, space, alice, bob, carol, as_alice):
    # given: each ordering of the same members is a group of its own
    monkeypatch.setattr(services, "MAX_GROUPS_PER_MEMBER", 2)
    groups = "/v0/spaces/lab/groups"
    for members in (["@alice", "@bob"], ["@bob", "@alice"]):
        assert as_alice.post(groups, {"members": members}).status_code == 201
    # when
    refused = as_alice.post(groups, {"members": ["@alice", "@bob", "@carol"]})
    # then: a new one is refused; one already made is still found
    assert error_code(refused) == "LIMIT_EXCEEDED"
    assert as_alice.post(groups, {"members": ["@alice", "@bob"]}).status_code == 200
    assert Conversation.objects.filter(space=space, kind="group").count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_group_made_twice_at_once_at_the_cap_is_found_not_refused(monkeypatch):
    import threading

    from django.db import connections

    # given: alice may make one group more; the first making of it pauses before its commit
    alice, bob = (services.create_member(h, actor=None) for h in ("alice", "bob"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    monkeypatch.setattr(services, "MAX_GROUPS_PER_MEMBER", 1)
    made, proceed, results = threading.Event(), threading.Event(), {}
    original = services.append_events

    def pausing(events, *args, **kwargs):
        rows = original(events, *args, **kwargs)
        if threading.current_thread().name == "first":
            made.set()
            proceed.wait(10)
        return rows

    monkeypatch.setattr(services, "append_events", pausing)

    def make():
        try:
            results[threading.current_thread().name] = services.get_or_create_group(space, [alice, bob],
                                                                                   actor=alice)[1]
        except Exception as exc:  # noqa: BLE001 - compared below
            results[threading.current_thread().name] = repr(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=make, name="first")
    first.start()
    assert made.wait(10)
    # when: the same group again, which waits for the first's lock on alice's row
    second = threading.Thread(target=make, name="second")
    second.start()
    someone_waits_for_a_lock()
    proceed.set()
    first.join(20)
    second.join(20)
    # then: one made it, the other found it
    assert results == {"first": True, "second": False}
