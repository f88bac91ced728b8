"""SPEC §6: snapshots of a member's unresolved inbox, page by page, each
page read at the moment the snapshot was taken."""
import datetime as dt

from django.db.models import F

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.models import LogHead
from inbox.services import send_message
from tests.conftest import error_code
from tests.inbox.test_feeds import drain


def test_snapshot_pages_keep_their_watermark(space, alice, bob, as_bob, monkeypatch):
    # given
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 2)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    sent = [send_message(direct, body=f"task {i}", actor=alice).message for i in range(5)]
    as_bob.post(f"/v0/messages/{sent[1].public_id}/resolve", {"result": "done"})
    as_bob.post(f"/v0/messages/{sent[2].public_id}/acknowledge")
    # when
    first = as_bob.get("/v0/me/snapshot").json()
    send_message(direct, body="after the snapshot", actor=alice)
    pages = [first]
    while pages[-1]["next_page"]:
        pages.append(as_bob.get("/v0/me/snapshot", page=pages[-1]["next_page"]).json())
    # then
    assert len(pages) == 2
    assert {p["snapshot_id"] for p in pages} == {first["snapshot_id"]}
    assert {p["high_watermark"] for p in pages} == {first["high_watermark"]}
    bodies = [u["message"]["body"] for p in pages for u in p["unresolved"]]
    assert bodies == ["task 0", "task 2", "task 3", "task 4"]
    assert [u["state"] for p in pages for u in p["unresolved"]][1] == "acknowledged"
    since = drain(as_bob, "/v0/me/inbox/events", cursor=first["cursor"])[0]
    assert [e["data"]["message"]["body"] for e in since] == ["after the snapshot"]


def test_snapshot_page_tokens_are_bound_and_expire(space, alice, bob, as_bob, as_alice, monkeypatch):
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 1)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(3):
        send_message(direct, body=f"task {i}", actor=alice)
    token = as_bob.get("/v0/me/snapshot").json()["next_page"]
    assert error_code(as_alice.get("/v0/me/snapshot", page=token)) == "INVALID_CURSOR"
    with freeze(now() + dt.timedelta(hours=2)):
        expired = as_bob.get("/v0/me/snapshot", page=token)
    assert expired.status_code == 410 and error_code(expired) == "RESYNC_REQUIRED"
    # and: one whose position was pruned says so, with the floor, as a feed's cursor does ("expired", {} before)
    send_message(direct, body="later", actor=alice)
    LogHead.objects.update(floor=F("position"))  # (as a prune past the snapshot's moment leaves it)
    pruned = as_bob.get("/v0/me/snapshot", page=token)
    assert pruned.status_code == 410 and "pruned" in pruned.json()["error"]["message"]
    assert pruned.json()["error"]["details"] == {"floor": LogHead.objects.get().floor}


def test_snapshot_forgets_spaces_you_were_removed_from(private_direct, alice, bob, api_for):
    # given
    space, direct = private_direct
    send_message(direct, body="secret plan for bob", actor=alice)
    as_bob = api_for(bob)
    assert len(as_bob.get("/v0/me/snapshot").json()["unresolved"]) == 1
    # when
    services.remove_member(space, bob, actor=alice)
    # then
    snapshot = as_bob.get("/v0/me/snapshot").json()
    assert snapshot["unresolved"] == [] and "secret" not in str(snapshot)


def test_every_snapshot_page_reads_the_moment_it_was_taken(space, alice, bob, as_bob, monkeypatch):
    # given: a snapshot of three unresolved messages, one per page
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 1)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    sent = [send_message(direct, body=f"task {i}", actor=alice).message for i in range(3)]
    first = as_bob.get("/v0/me/snapshot").json()
    # when: while bob pages, he resolves the second and acknowledges the third
    as_bob.post(f"/v0/messages/{sent[1].public_id}/resolve", {"result": "done"})
    as_bob.post(f"/v0/messages/{sent[2].public_id}/acknowledge")
    pages = [first]
    while pages[-1]["next_page"]:
        pages.append(as_bob.get("/v0/me/snapshot", page=pages[-1]["next_page"]).json())
    # then: the later pages show them as they were when the snapshot was taken
    unresolved = [u for p in pages for u in p["unresolved"]]
    assert [(u["message"]["body"], u["state"], u["acknowledged_at"]) for u in unresolved] == [
        ("task 0", "pending", None), ("task 1", "pending", None), ("task 2", "pending", None)]
