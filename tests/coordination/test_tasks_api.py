"""Tasks through the API (SPEC §10): the routes, who may do what, the
events in the space feed."""
import pytest

from controlplane import services
from controlplane.log import Event
from coordination import services as coordination_services
from coordination.models import Task
from tests.conftest import error_code

TASKS = "/v0/spaces/lab/tasks"


def task_url(task_id: str, action: str = "") -> str:
    return f"{TASKS}/{task_id}" + (f"/{action}" if action else "")


def kinds_in_feed() -> list[str]:
    return [e.kind for e in Event.objects.filter(kind__startswith="task").order_by("position")]


@pytest.fixture
def task(space, as_alice):
    response = as_alice.post(TASKS, {"title": "Write the report", "description": "Two pages.", "reviewer": "@carol"})
    assert response.status_code == 201
    return response.json()["task"]


def test_a_created_task_is_open_with_its_own_discussion_channel(space, as_alice, as_bob, task):
    # then
    assert task | {"id": None, "conversation": None, "created_at": None, "updated_at": None} == {
        "id": None, "space": "lab", "title": "Write the report", "description": "Two pages.", "status": "open",
        "assignee": None, "reviewer": "@carol", "claimant": None, "claimed_at": None, "conversation": None,
        "created_by": "@alice", "created_at": None, "updated_at": None}
    assert task["id"].startswith("tsk_")
    # the discussion is a conversation every reader of the space can use
    posted = as_bob.post(f"/v0/spaces/lab/conversations/{task['conversation']}/messages", {"body": "on it?"})
    assert posted.status_code == 201
    assert as_bob.get(task_url(task["id"])).json() == {"task": task}
    assert kinds_in_feed() == ["task.created"]
    # announced in the space feed as every channel is, before the task that discusses in it
    feed = [(e["kind"], e["conversation"]) for e in as_bob.get("/v0/spaces/lab/events").json()["events"]
            if e["conversation"] == task["conversation"]]
    assert feed[:2] == [("conversation.created", task["conversation"]), ("task.created", task["conversation"])]


def test_the_whole_lifecycle_claim_submit_reopen_complete(space, as_alice, as_bob, as_carol, task):
    # when
    claimed = as_bob.post(task_url(task["id"], "claim"))
    again = as_bob.post(task_url(task["id"], "claim"))
    taken = as_carol.post(task_url(task["id"], "claim"))
    submitted = as_bob.post(task_url(task["id"], "submit"))
    reopened = as_carol.post(task_url(task["id"], "reopen"))
    as_bob.post(task_url(task["id"], "claim"))
    as_bob.post(task_url(task["id"], "submit"))
    completed = as_carol.post(task_url(task["id"], "complete"))
    # then
    assert claimed.status_code == 200 and claimed.json()["task"]["claimant"] == "@bob"
    assert claimed.json()["task"]["status"] == "claimed" and again.json() == claimed.json()
    assert taken.status_code == 409 and error_code(taken) == "CONFLICT"
    assert taken.json()["error"]["details"] == {"status": "claimed", "claimant": "@bob"}
    assert submitted.json()["task"]["status"] == "in_review"
    assert reopened.json()["task"] | {"updated_at": None} == {**task, "updated_at": None}
    assert completed.json()["task"]["status"] == "done"
    assert kinds_in_feed() == ["task.created", "task.claimed", "task.submitted", "task.reopened", "task.claimed",
                               "task.submitted", "task.completed"]


def test_release_puts_the_task_back(space, as_bob, as_carol, task):
    # given
    as_bob.post(task_url(task["id"], "claim"))
    # when
    refused = as_carol.post(task_url(task["id"], "release"))
    released = as_bob.post(task_url(task["id"], "release"))
    # then
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"
    assert released.json()["task"]["status"] == "open" and released.json()["task"]["claimant"] is None
    assert as_carol.post(task_url(task["id"], "claim")).json()["task"]["claimant"] == "@carol"


@pytest.mark.parametrize("who, may", [("alice", True), ("bob", False), ("carol", True)])
def test_only_the_reviewer_the_assignee_or_a_space_admin_completes(space, api_for, alice, bob, carol, task, who,
                                                                   may):
    # when
    response = api_for({"alice": alice, "bob": bob, "carol": carol}[who]).post(task_url(task["id"], "complete"))
    # then
    assert response.status_code == (200 if may else 403)
    assert Task.objects.get().status == ("done" if may else "open")


def test_an_assigned_task_is_claimed_by_its_assignee(space, as_alice, as_bob, as_carol):
    # given
    task = as_alice.post(TASKS, {"title": "Yours", "assignee": "@carol"}).json()["task"]
    # when
    refused = as_bob.post(task_url(task["id"], "claim"))
    claimed = as_carol.post(task_url(task["id"], "claim"))
    # then
    assert refused.status_code == 403 and claimed.status_code == 200


def test_update_changes_fields_and_says_so(space, as_alice, as_bob, task):
    # when
    refused = as_bob.patch(task_url(task["id"]), {"title": "Mine now"})
    updated = as_alice.patch(task_url(task["id"]), {"title": "Write the long report", "assignee": "@bob"})
    # then
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"
    assert updated.json()["task"]["title"] == "Write the long report"
    assert updated.json()["task"]["assignee"] == "@bob"
    assert kinds_in_feed() == ["task.created", "task.updated"]


@pytest.mark.parametrize("body", [{}, {"title": "Write the report"}, {"assignee": None, "description": "Two pages."}])
def test_an_update_that_changes_nothing_writes_nothing(space, as_alice, task, body):
    # when its creator sends what it already is, or nothing
    response = as_alice.patch(task_url(task["id"]), body)
    # then the task is answered as it was: no event wakes anyone, and a claim's silence is not restarted (SPEC §10)
    assert response.status_code == 200 and response.json()["task"] == task
    assert kinds_in_feed() == ["task.created"]


def test_a_member_has_so_many_unfinished_tasks_in_a_space(monkeypatch, space, as_alice, as_bob):
    # given: alice has two unfinished tasks, the limit
    monkeypatch.setattr(coordination_services, "MAX_UNFINISHED_TASKS_PER_MEMBER", 2)
    made = [as_alice.post(TASKS, {"title": f"t{n}"}).json()["task"]["id"] for n in range(2)]
    # when
    refused = as_alice.post(TASKS, {"title": "one more"})
    # then: refused, and nothing made of it; another member still creates tasks
    assert refused.status_code == 409 and error_code(refused) == "LIMIT_EXCEEDED"
    assert Task.objects.count() == 2 and kinds_in_feed() == ["task.created"] * 2
    assert as_bob.post(TASKS, {"title": "bob's"}).status_code == 201
    # when one of hers is done, she has room for one more
    as_alice.post(f"{TASKS}/{made[0]}/claim")
    as_alice.post(f"{TASKS}/{made[0]}/complete")
    assert as_alice.post(TASKS, {"title": "one more"}).status_code == 201
    # and: reopening the done one would make three unfinished: refused as a new one is (it went through)
    reopened = as_alice.post(f"{TASKS}/{made[0]}/reopen")
    assert reopened.status_code == 409 and error_code(reopened) == "LIMIT_EXCEEDED"
    assert Task.objects.get(public_id=made[0]).status == "done"


@pytest.mark.parametrize("body", [
    {}, {"title": ""}, {"title": "   "}, {"title": 5}, {"title": "x" * 201}, {"title": "t", "colour": "red"},
    {"title": "t", "assignee": "@nobody"}, {"title": "t", "reviewer": "not a handle"},
    {"title": "t", "description": "d" * (8 * 1024 + 1)}, [],
])
def test_bad_input_is_a_clear_4xx_and_creates_nothing(space, as_alice, body):
    # when
    response = as_alice.post(TASKS, body)
    # then
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert Task.objects.count() == 0 and kinds_in_feed() == []


def test_title_and_description_limits_are_bytes_in_the_answers_and_the_schema_alike(space, as_alice, anon):
    # a title of 100 two-byte characters is 200 bytes; one more is over, and so is 201 ASCII characters
    assert as_alice.post(TASKS, {"title": "\u00e9" * 100}).status_code == 201
    refused = [as_alice.post(TASKS, {"title": title}) for title in ("\u00e9" * 101, "x" * 201)]
    assert all(r.status_code == 400 and "bytes" in r.json()["error"]["message"] for r in refused)
    # and the schema says bytes, with no maxLength (which counts characters)
    schema = anon.client.get("/v0/schema/", HTTP_ACCEPT="application/json").json()
    fields = schema["components"]["schemas"]["TaskCreateInRequest"]["properties"]
    assert [("maxLength" in fields[f], "bytes" in fields[f]["description"]) for f in ("title", "description")] == [
        (False, True), (False, True)]


def test_an_assignee_or_reviewer_is_a_writer_of_the_space(space, alice, as_alice, make_member):
    # given: the space is open, so anyone may read it; dave never joined, eve only observes, nobody is nobody
    make_member("dave")
    services.add_member(space, make_member("eve"), role="observer", actor=alice)
    # when
    named = ("@dave", "@eve", "@nobody", "not a handle")
    refused = [as_alice.post(TASKS, {"title": "t", field: who}) for field in ("assignee", "reviewer") for who in named]
    made = as_alice.post(TASKS, {"title": "t", "assignee": "@bob", "reviewer": "@carol"})
    # then: neither could ever move the task, so neither is taken
    assert [(r.status_code, r.json()["error"]["details"]["field"]) for r in refused] == [
        (400, field) for field in ("assignee", "reviewer") for _ in named]
    assert made.status_code == 201 and Task.objects.count() == 1
    task = made.json()["task"]["id"]
    assert error_code(as_alice.patch(task_url(task), {"assignee": "@dave"})) == "INVALID_REQUEST"


def test_lists_page_by_cursor_and_filter_by_status(space, as_alice, as_bob):
    # given
    ids = [as_alice.post(TASKS, {"title": f"t{n}"}).json()["task"]["id"] for n in range(5)]
    as_bob.post(task_url(ids[1], "claim"))
    as_bob.post(task_url(ids[3], "claim"))
    # when
    first = as_bob.get(TASKS, limit=3).json()
    rest = as_bob.get(TASKS, limit=3, cursor=first["cursor"]).json()
    claimed = as_bob.get(TASKS, status="claimed").json()
    foreign = as_bob.get(TASKS, status="open", cursor=first["cursor"])
    bad = as_bob.get(TASKS, status="lost")
    # then
    assert [t["id"] for t in first["tasks"] + rest["tasks"]] == ids
    assert first["has_more"] and not rest["has_more"]
    assert [t["id"] for t in claimed["tasks"]] == [ids[1], ids[3]]
    assert foreign.status_code == 400 and error_code(foreign) == "INVALID_CURSOR"
    assert bad.status_code == 400 and error_code(bad) == "INVALID_REQUEST"


def test_private_spaces_hide_their_tasks_and_observers_cannot_write(make_member, api_for, alice, bob):
    # given
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="open",
                                  actor=alice)
    watcher = make_member("watcher")
    services.add_member(vault, watcher, role="observer", actor=alice)
    task = api_for(alice).post("/v0/spaces/vault/tasks", {"title": "secret"}).json()["task"]
    # when
    outsider = api_for(bob).get(f"/v0/spaces/vault/tasks/{task['id']}")
    observer_reads = api_for(watcher).get(f"/v0/spaces/vault/tasks/{task['id']}")
    observer_claims = api_for(watcher).post(f"/v0/spaces/vault/tasks/{task['id']}/claim")
    # then
    assert outsider.status_code == 404 and error_code(outsider) == "NOT_FOUND"
    assert observer_reads.status_code == 200
    assert observer_claims.status_code == 403 and Task.objects.get().status == "open"


def test_anonymous_callers_read_no_tasks(space, anon, task):
    # when
    response = anon.get(task_url(task["id"]))
    # then
    assert response.status_code == 401 and error_code(response) == "UNAUTHENTICATED"


def test_a_retried_claim_with_its_key_answers_the_same(space, as_bob, task):
    # when
    first = as_bob.post(task_url(task["id"], "claim"), headers={"Idempotency-Key": "claim-0001"})
    replay = as_bob.post(task_url(task["id"], "claim"), headers={"Idempotency-Key": "claim-0001"})
    # then
    assert first.status_code == replay.status_code == 200 and replay.json() == first.json()
    assert kinds_in_feed() == ["task.created", "task.claimed"]


@pytest.mark.parametrize("body", [{"title": "nul\x00here"}, {"title": "lone \ud800"},
                                  {"title": "ok", "description": "nul\x00"}])
def test_text_a_database_would_refuse_is_422_invalid_body(space, as_alice, task, body):
    # when
    created = as_alice.post(TASKS, body)
    updated = as_alice.patch(task_url(task["id"]), body)
    # then
    assert created.status_code == updated.status_code == 422
    assert error_code(created) == error_code(updated) == "INVALID_BODY"
    assert Task.objects.count() == 1 and Task.objects.get().title == "Write the report"


def test_only_writers_of_an_active_space_move_tasks(space, make_member, api_for, alice, bob, as_alice, as_bob):
    """Every move needs what creating and claiming need: an active member
    who is not an observer, in a space that is not archived."""
    # given: bob's claim, then bob removed; a reviewer made an observer since
    claimed = as_alice.post(TASKS, {"title": "Claimed by bob"}).json()["task"]
    as_bob.post(task_url(claimed["id"], "claim"))
    services.remove_member(space, bob, actor=alice)
    watcher = make_member("watcher")
    services.add_member(space, watcher, actor=alice)
    reviewed = as_alice.post(TASKS, {"title": "Reviewed", "reviewer": "@watcher"}).json()["task"]
    services.add_member(space, watcher, role="observer", actor=alice)
    as_watcher = api_for(watcher)
    # when / then: the removed claimant and the observer reviewer are refused
    for response in (as_bob.post(task_url(claimed["id"], "submit")), as_bob.post(task_url(claimed["id"], "release")),
                     as_watcher.post(task_url(reviewed["id"], "complete"))):
        assert response.status_code == 403 and error_code(response) == "FORBIDDEN", response.json()
    # and: in an archived space nothing moves, not even for its owner
    space.archived = True
    space.save(update_fields=["archived"])
    released = as_alice.post(task_url(claimed["id"], "release"))
    assert released.status_code == 409 and error_code(released) == "CONFLICT"
    assert Task.objects.get(public_id=claimed["id"]).status == "claimed"


def test_a_listing_sweeps_expired_claims_as_a_read_of_one_task_does(space, as_alice, as_bob):
    import datetime as dt

    from controlplane.clock import freeze, now

    # given: bob's claim, silent for longer than the timeout, on a host with no worker
    task = as_alice.post(TASKS, {"title": "Left behind"}).json()["task"]
    as_bob.post(task_url(task["id"], "claim"))
    with freeze(now() + dt.timedelta(hours=25)):
        # when: the open tasks are listed
        listed = as_alice.get(TASKS + "?status=open").json()["tasks"]
    # then: the expired claim's task is among them
    assert [t["id"] for t in listed] == [task["id"]]
    assert kinds_in_feed()[-1] == "task_claim_expired"
