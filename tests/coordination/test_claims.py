"""Claims, silence, check-ins and expiry (SPEC §10), on the injected clock."""
from __future__ import annotations

import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.log import Event
from coordination import claims
from coordination import services as tasks
from coordination.models import CheckinReceipt, Task
from inbox.services import send_message

HOUR = dt.timedelta(hours=1)


@pytest.fixture
def start():
    return now().replace(microsecond=0)


@pytest.fixture
def claimed(space, alice, bob, start):
    """A task bob claimed at `start` (CLAIM_TTL_HOURS is 24: check-in from
    18 h of silence, expiry at 24 h)."""
    with freeze(start):
        task = tasks.create_task(space, title="Report", actor=alice)
        return tasks.claim_task(space, task.public_id, actor=bob)


def at(moment):
    """Run `claims.scan` with the clock at `moment`."""
    with freeze(moment):
        return claims.scan()


def events(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind).order_by("position"))


def say(task: Task, member, moment, body="progress"):
    with freeze(moment):
        send_message(task.conversation, body=body, actor=member)


def test_silence_then_one_checkin_then_expiry(claimed, bob, start):
    # when / then: nothing before 75% of the timeout
    assert at(start + 17 * HOUR)["checkins"] == 0
    # one check-in at 18 h, however often the sweep looks
    assert at(start + 18 * HOUR)["checkins"] == 1
    assert at(start + 20 * HOUR)["checkins"] == 0
    (checkin,) = events("task_claim_checkin")
    assert checkin.data["claimant"] == "@bob" and checkin.data["task"]["status"] == "claimed"
    assert checkin.data["expires_at"].startswith((start + 24 * HOUR).strftime("%Y-%m-%dT%H:%M:%S"))
    # the claim expires at the full timeout, and the task reopens
    assert at(start + 24 * HOUR)["expired"] == 1
    task = Task.objects.get()
    assert task.status == "open" and task.claimant is None
    (expired,) = events("task_claim_expired")
    assert expired.data["claimant"] == "@bob" and expired.data["task"]["status"] == "open"


def test_a_claimant_message_postpones_the_silence_but_not_the_receipt(claimed, bob, start):
    # given: checked in at 18 h, then bob reports progress at 19 h
    at(start + 18 * HOUR)
    say(claimed, bob, start + 19 * HOUR)
    # when / then: no second check-in for the same task update
    assert at(start + 19 * HOUR + 18 * HOUR)["checkins"] == 0
    # the claim lives until 24 h after the message
    assert at(start + 19 * HOUR + 23 * HOUR)["expired"] == 0
    assert at(start + 19 * HOUR + 24 * HOUR)["expired"] == 1


def test_messages_by_others_are_not_the_claimants_progress(claimed, carol, start):
    # given
    say(claimed, carol, start + 10 * HOUR, "any news?")
    # when / then
    assert at(start + 24 * HOUR)["expired"] == 1


def test_a_task_update_is_a_fresh_checkin_key(claimed, space, alice, start):
    # given: checked in once, then the task row changes
    at(start + 18 * HOUR)
    with freeze(start + 20 * HOUR):
        tasks.update_task(space, claimed.public_id, {"description": "More detail."}, actor=alice)
    # when / then: silence runs from the update, and a second check-in is due
    assert at(start + 20 * HOUR + 17 * HOUR)["checkins"] == 0
    assert at(start + 20 * HOUR + 18 * HOUR)["checkins"] == 1
    assert CheckinReceipt.objects.count() == 2


def test_in_review_is_exempt(claimed, space, bob, start):
    # given
    with freeze(start + HOUR):
        tasks.submit_task(space, claimed.public_id, actor=bob)
    # when
    outcome = at(start + 100 * HOUR)
    # then
    assert outcome == {"checkins": 0, "expired": 0, "looked_at": 0}
    assert Task.objects.get().status == "in_review"


def test_zero_disables_both(claimed, settings, start):
    # given
    settings.CLAIM_TTL_HOURS = 0
    # when
    outcome = at(start + 1000 * HOUR)
    with freeze(start + 1000 * HOUR):
        read = tasks.visible_task(claimed.space, claimed.public_id, claimed.claimant)
    # then
    assert outcome == {"checkins": 0, "expired": 0, "looked_at": 0} and read.status == "claimed"
    assert events("task_claim_checkin") == [] and events("task_claim_expired") == []


def test_reads_sweep_expiry_and_a_new_claimant_takes_expired_work_at_once(claimed, space, bob, carol, start):
    # when: no sweep ran at all; carol's claim attempt finds the claim expired
    with freeze(start + 25 * HOUR):
        taken = tasks.claim_task(space, claimed.public_id, actor=carol)
    # then
    assert taken.claimant == carol and taken.status == "claimed"
    assert [e.kind for e in Event.objects.filter(kind__startswith="task").order_by("position")] == [
        "task.created", "task.claimed", "task_claim_expired", "task.claimed"]


def test_a_read_before_the_timeout_changes_nothing(claimed, space, bob, start):
    # when
    with freeze(start + 23 * HOUR):
        read = tasks.visible_task(space, claimed.public_id, bob)
    # then: reads never renew a claim either
    assert read.status == "claimed" and read.updated_at == claimed.updated_at
    assert at(start + 24 * HOUR)["expired"] == 1


def test_a_claimant_message_committed_during_a_sweep_preserves_the_claim(claimed, bob, start, monkeypatch):
    # given: the scan's read finds the claim due, then bob's message commits
    read = claims.due_claims

    def read_then_bob_speaks(moment):
        due = read(moment)
        say(claimed, bob, start + 24 * HOUR - dt.timedelta(seconds=1), "still on it")
        return due

    monkeypatch.setattr(claims, "due_claims", read_then_bob_speaks)
    # when
    outcome = at(start + 24 * HOUR)
    # then
    assert outcome["looked_at"] == 1 and outcome["expired"] == 0
    assert Task.objects.get().status == "claimed"


def test_scans_are_bounded_101_due_claims_take_two_scans(space, alice, bob, start):
    # given
    with freeze(start):
        for n in range(101):
            task = tasks.create_task(space, title=f"t{n}", actor=alice)
            tasks.claim_task(space, task.public_id, actor=bob)
    # when
    first, second = at(start + 18 * HOUR), at(start + 18 * HOUR)
    # then
    assert (first["checkins"], second["checkins"]) == (100, 1)
    assert len(events("task_claim_checkin")) == 101


def test_the_sweep_runs_at_most_once_a_minute(claimed, start):
    # when
    with freeze(start + 18 * HOUR):
        first = claims.sweep()
        second = claims.sweep()
    with freeze(start + 18 * HOUR + dt.timedelta(minutes=1)):
        third = claims.sweep()
    # then
    assert first["checkins"] == 1 and second is None and third == {"checkins": 0, "expired": 0, "looked_at": 0}


def test_archived_spaces_are_not_swept(claimed, space, alice, start):
    # given
    space.archived = True
    space.save()
    # when
    outcome = at(start + 30 * HOUR)
    # then
    assert outcome["checkins"] == outcome["expired"] == 0
    assert Task.objects.get().status == "claimed"


def test_a_claim_whose_claimant_was_deleted_is_released_and_stops_nothing(space, alice, bob, make_member, as_bob,
                                                                           start):
    # given: dave's claim and bob's; then dave is deleted (the admin site may), leaving his claim with no claimant
    from controlplane import services

    dave = make_member("dave")
    services.join_space(space, actor=dave)
    with freeze(start):
        gone = tasks.claim_task(space, tasks.create_task(space, title="dave's", actor=alice).public_id, actor=dave)
        tasks.claim_task(space, tasks.create_task(space, title="bob's", actor=alice).public_id, actor=bob)
    dave.delete()
    # when: the sweep reaches the check-ins, and a listing after the timeout
    checked = at(start + 18 * HOUR)
    with freeze(start + 25 * HOUR):
        listing = as_bob.get("/v0/spaces/lab/tasks")
    # then: dave's task was opened at the first look, with no claimant named; bob's claim was checked in on
    # and expired as ever
    assert checked == {"checkins": 1, "expired": 1, "looked_at": 2}
    assert listing.status_code == 200 and {t["status"] for t in listing.json()["tasks"]} == {"open"}
    expired = events("task_claim_expired")
    assert [e.data["task"]["id"] for e in expired][0] == gone.public_id and expired[0].data["claimant"] is None


def test_reads_pass_live_claims_by_and_never_hide_an_expired_one(space, alice, bob, carol, make_member, api_for,
                                                                 start, monkeypatch):
    # given: 100 of bob's claims kept alive by his messages, and carol's, a minute younger, silent since
    decided = []
    decide = claims._decide
    monkeypatch.setattr(claims, "_decide", lambda *args: decided.append(args[0]) or decide(*args))
    with freeze(start):
        live = [tasks.claim_task(space, tasks.create_task(space, title=f"t{n}", actor=alice).public_id, actor=bob)
                for n in range(100)]
    for task in live:
        say(task, bob, start + 20 * HOUR, "still on it")
    with freeze(start + dt.timedelta(minutes=1)):
        silent = tasks.claim_task(space, tasks.create_task(space, title="left", actor=alice).public_id, actor=carol)
    reader = api_for(make_member("dave"))  # never joined: an open space's reader
    # when: anyone lists the open tasks, twice, with no worker sweeping
    with freeze(start + 25 * HOUR):
        first = reader.get("/v0/spaces/lab/tasks", status="open").json()["tasks"]
        once = len(decided)
        second = reader.get("/v0/spaces/lab/tasks", status="open").json()["tasks"]
    # then: the first decides at most a page of claims and moves them on; the second finds carol's expired
    assert once == claims.SCAN_LIMIT and [t["id"] for t in first] == []
    assert [t["id"] for t in second] == [silent.public_id] and len(decided) == once + 1


@pytest.mark.postgres
def test_a_claimants_silence_is_read_from_their_own_messages_in_the_thread(claimed, alice, bob):
    """However many messages others write in the task's discussion: before,
    the read walked the thread backwards, filtering by author."""
    from django.db import connection

    from inbox.models import Message

    # given: alice's messages in the thread, bob's one before them
    send_message(claimed.conversation, body="on it", actor=bob)
    for n in range(200):
        send_message(claimed.conversation, body=f"ping {n}", actor=alice)
    # when: the read is planned as on a big table, with statistics that say who wrote how much
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Message._meta.db_table}")
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = claims.claimant_messages(claimed)[:1].explain()
    # then: one index seek to bob's latest message there, no sort, no filter by author
    assert "message_author_conversation" in plan and "Sort" not in plan and "Filter" not in plan, plan
    assert claims.silent_since(claimed) == max(claimed.updated_at, Message.objects.get(body="on it").created_at)


@pytest.mark.parametrize("then_hours", [0, 48])
def test_claims_made_under_another_timeout_follow_the_new_one(space, alice, bob, start, settings, then_hours):
    """A claim made while the timeout was off had no next look, and one made
    under a longer timeout had its next look past the new whole timeout."""
    # given: bob's claim, made under the timeout of then
    settings.CLAIM_TTL_HOURS = then_hours
    with freeze(start):
        task = tasks.create_task(space, title="Report", actor=alice)
        tasks.claim_task(space, task.public_id, actor=bob)
    # when: the timeout is 24 h from an hour later (the minute's scan runs), and bob stays silent past it
    settings.CLAIM_TTL_HOURS = 24
    at(start + HOUR)
    at(start + 25 * HOUR)
    # then: the claim expired, as one made under today's timeout would have
    task.refresh_from_db()
    assert task.status == "open" and [e.data["claimant"] for e in events("task_claim_expired")] == ["@bob"]


@pytest.mark.parametrize("then_hours", [0, 48])
def test_without_a_worker_reads_and_claims_follow_the_new_timeout_too(space, alice, bob, carol, start, settings,
                                                                       then_hours):
    """Reads and claim attempts looked only at claims due in the sweep
    index: with no scan to catch up a claim made under another timeout, a
    host without a worker never reopened it."""
    # given: bob's claim, made under the timeout of then; the timeout is 24 h now
    settings.CLAIM_TTL_HOURS = then_hours
    with freeze(start):
        task = tasks.create_task(space, title="Report", actor=alice)
        tasks.claim_task(space, task.public_id, actor=bob)
    settings.CLAIM_TTL_HOURS = 24
    # when: someone lists the tasks an hour later, and carol claims 25 h later, with no scan run
    with freeze(start + HOUR):
        list(tasks.space_tasks(space, carol))
    with freeze(start + 25 * HOUR):
        taken = tasks.claim_task(space, task.public_id, actor=carol)
    # then: bob's claim expired in her request, and the task is hers
    assert taken.claimant == carol and [e.data["claimant"] for e in events("task_claim_expired")] == ["@bob"]


def test_unarchiving_a_space_takes_up_its_claims_expiry_again(claimed, space, carol, start, make_member):
    """A look while the space was archived put the next a whole timeout
    away: unarchived, an expired claim refused new claimants for up to a
    day more."""
    from django.test import Client

    admin = make_member("root", kind="human", is_admin=True, password="root-pass-123")
    client = Client()
    client.force_login(admin.user)
    # given: bob's claim, looked at while the space was archived, a day after it was made
    Space = type(space)
    Space.objects.filter(pk=space.pk).update(archived=True)
    with freeze(start + 25 * HOUR):
        assert claims.expire_if_due(space, claimed.public_id) is False  # what a read does first
    # when: an admin unarchives it
    form = {"name": space.name, "visibility": space.visibility, "send_policy": space.send_policy,
            "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0}
    assert client.post(f"/admin/controlplane/space/{space.pk}/change/", form).status_code == 302
    assert Space.objects.get(pk=space.pk).archived is False
    # then: carol takes the task the next hour, bob's claim expiring in her request
    with freeze(start + 26 * HOUR):
        taken = tasks.claim_task(space, claimed.public_id, actor=carol)
    assert taken.claimant == carol and [e.data["claimant"] for e in events("task_claim_expired")] == ["@bob"]


@pytest.mark.parametrize("change", ["removed", "left", "observer", "suspended"])
def test_a_claimant_who_may_no_longer_write_lets_the_work_go_at_the_next_look(claimed, space, alice, bob, start,
                                                                             change):
    """A removed, demoted or suspended claimant held the work until the
    claim's silence ran out (24 hours by default), and no one else could
    take it meanwhile."""
    # when: an hour into the claim
    with freeze(start + HOUR):
        if change in ("removed", "left"):
            services.remove_member(space, bob, actor=alice if change == "removed" else bob)
        elif change == "observer":
            services.add_member(space, bob, role="observer", actor=alice)
        else:
            services.update_member(bob, status="suspended", actor=None)
        # then: the next read lets it go, saying why
        task = tasks.visible_task(space, claimed.public_id, alice)
    assert task.status == "open" and task.claimant is None
    (expired,) = events("task_claim_expired")
    assert (expired.data["claimant"], expired.data["reason"]) == ("@bob", "claimant_gone")


def test_a_claimant_reinstated_before_the_look_keeps_the_claim(claimed, space, bob, start):
    with freeze(start + HOUR):
        services.update_member(bob, status="suspended", actor=None)
        services.update_member(bob, status="active", actor=None)
    # when: the sweep looks, and again when the silence runs out
    assert at(start + 2 * HOUR)["expired"] == 0
    assert Task.objects.get().claimant == bob and events("task_claim_expired") == []
    assert at(start + 24 * HOUR)["expired"] == 1
    assert events("task_claim_expired")[0].data["reason"] == "silence"
