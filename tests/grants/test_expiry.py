"""A grant's expiry fences it within a second (the worker command's watch),
not at the minute's schedule 30–90 s later (SPEC §5, "Expiry")."""
import datetime as dt
import time

import httpx
import pytest
from django.db import connections

from controlplane.clock import freeze, now
from controlplane.schedules import Watcher
from grants import barrier
from grants.models import Grant
from inbox.models import InboxItem
from tests.grants.test_barrier import send
from tests.servers import cut_every_database_connection, member_token, serving


def test_the_watch_fences_what_expired_and_has_a_worker_finish_it(bob_to_carol, grant, as_bob, monkeypatch):
    # given: two grants with a message each, one of them past its expiry
    kicked = []
    monkeypatch.setattr(barrier, "kick", lambda *args: kicked.append(args))
    soon = grant("grt_soon", "pair", sender="@bob", recipient="@carol", expires_at=now() + dt.timedelta(seconds=30))
    send(as_bob, bob_to_carol, "under the grant that expires")
    later = grant("grt_later", "project", expires_at=now() + dt.timedelta(hours=1))
    # when: the watch runs, before and after the first expiry
    assert barrier.fence_expired() == 0
    with freeze(now() + dt.timedelta(seconds=31)):
        fenced = barrier.fence_expired()
    # then: that one is fenced (its item withheld from every read path) and a worker is asked to finish it
    assert fenced == 1 and kicked == [("grants.tasks.finish_barrier", soon.pk)]
    assert Grant.objects.get(pk=soon.pk).status == "revoking" and Grant.objects.get(pk=later.pk).status == "active"
    assert InboxItem.objects.get().admission == "withheld"


def test_one_spaces_many_expiring_grants_do_not_hold_back_anothers_fence(grant, carol, bob, monkeypatch):
    """The watch fenced the earliest 100 of the host: an owner's 2,000 grants
    expiring at one instant kept another space's expired grant (and what it
    admitted) active for 35 s."""
    from controlplane import services
    from grants import services as grants

    monkeypatch.setattr(barrier, "kick", lambda *args: None)
    # given: ten of alice's grants expiring first, then one of carol's own space
    at = now()
    flood = [grant(f"grt_flood{n}", "project", expires_at=at + dt.timedelta(seconds=10)) for n in range(10)]
    other = services.create_space(slug="other", name="Other", visibility="open", send_policy="explicit_only",
                                  actor=carol)
    services.join_space(other, actor=bob)
    grants.create_grant(other, grant_id="grt_victim", kind="project", actor=carol,
                        expires_at=at + dt.timedelta(seconds=11))
    # when: a watch that fences five at a time looks after both expired
    with freeze(at + dt.timedelta(seconds=12)):
        fenced = barrier.fence_expired(limit=5)
    # then: the other space's grant is among them, with the earliest of the flood
    statuses = dict(Grant.objects.values_list("public_id", "status"))
    assert fenced == 5 and statuses["grt_victim"] == "revoking"
    assert sorted(g.public_id for g in flood if statuses[g.public_id] == "revoking") == [
        "grt_flood0", "grt_flood1", "grt_flood2", "grt_flood3"]


def test_a_failing_watch_is_logged_once_a_minute_and_stops_nothing(monkeypatch, caplog):
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("the database is restarting")

    watcher = Watcher()
    watcher.watches = [failing]
    clock = [100.0]
    monkeypatch.setattr("controlplane.schedules.time.monotonic", lambda: clock[0])
    for _ in range(5):  # five seconds of ticks, ten a second
        for _ in range(10):
            watcher.tick()
            clock[0] += 0.1
    assert len(calls) == 5
    assert len([r for r in caplog.records if "watch" in r.getMessage()]) == 1


def test_grants_declare_their_watch():
    assert barrier.fence_expired in Watcher().watches


def _retried(call, *args, **kwargs) -> httpx.Response:
    """A request answered, past the 503s of a server whose pooled
    connections the test cut (its clients retry them)."""
    for _ in range(20):
        if (response := call(*args, **kwargs)).status_code != 503:
            return response
        time.sleep(0.1)
    return response


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cut", [False, pytest.param(True, marks=pytest.mark.postgres)],
                         ids=["steady", "after-every-connection-was-cut"])
def test_through_serve_an_expired_grants_item_is_withheld_within_seconds(cut):
    # given: an explicit_only space, and a pair grant that expires seconds from now
    # (and, in the second case, every database session cut first, as a restart does:
    # the worker's watch must not go on with the connection it had)
    alice, bob, carol = ({"Authorization": f"Bearer {member_token(h)}"} for h in ("alice", "bob", "carol"))
    with serving() as (base, _):
        httpx.post(f"{base}/v0/spaces", json={"slug": "vault", "name": "Vault", "send_policy": "explicit_only"},
                   headers=alice)
        for headers in (bob, carol):
            httpx.post(f"{base}/v0/spaces/vault/join", headers=headers)
        direct = httpx.post(f"{base}/v0/spaces/vault/direct", json={"member": "@carol"},
                            headers=bob).json()["conversation"]["id"]
        expiry = now() + dt.timedelta(seconds=6 if cut else 2)
        expires = expiry.isoformat().replace("+00:00", "Z")
        assert httpx.post(f"{base}/v0/spaces/vault/grants", headers=alice, json={
            "id": "grt_brief", "kind": "pair", "sender": "@bob", "recipient": "@carol",
            "expires_at": expires}).status_code == 201
        assert httpx.post(f"{base}/v0/spaces/vault/conversations/{direct}/messages", json={"body": "brief"},
                          headers=bob).status_code == 201
        assert len(httpx.get(f"{base}/v0/me/inbox", headers=carol).json()["items"]) == 1
        if cut:
            time.sleep(1.5)  # a round of the watch or two on the connections about to be cut
            cut_every_database_connection()
            connections["default"].close_pool()  # this process's own were cut too
            connections.close_all()
        # when: the expiry passes
        deadline = time.monotonic() + (expiry - now()).total_seconds() + 5  # the minute's schedule takes 30–90 s
        while (status := _retried(httpx.get, f"{base}/v0/grants/grt_brief", headers=alice).json()["grant"][
                "status"]) == "active" and time.monotonic() < deadline:
            time.sleep(0.2)
        # then: fenced within seconds: the inbox hands out nothing of it any more
        assert status in ("revoking", "expired")
        items = _retried(httpx.get, f"{base}/v0/me/inbox", headers=carol).json()["items"]
        assert [entry["item"].get("content") for entry in items if entry["item"]["kind"] == "direct"] == []


def test_each_round_of_watches_gives_its_connection_back(db, monkeypatch):
    # given: a watch that fails, as one whose connection the database restart broke would
    closed = []
    monkeypatch.setattr("controlplane.schedules.connections.close_all", lambda: closed.append(1))
    watcher = Watcher()
    watcher.watches = [lambda: 1 / 0, lambda: None]
    # when
    watcher.tick()
    # then: the round ran every watch and closed its connections, so the next takes a fresh one
    assert closed == [1]
