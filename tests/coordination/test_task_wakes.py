"""Tasks wake space subscriptions (SPEC §8, §10): `{"type": "task"}`
subjects, and check-ins that wake the claimant's subscriptions only."""
import datetime as dt

import pytest

from controlplane.clock import freeze, now
from coordination import claims
from coordination import services as tasks
from inbox.services import send_message
from tests.conftest import error_code
from tests.webhooks.test_subscriptions import activate, endpoint, subscribe, wakes  # noqa: F401 (a fixture)


def verified_endpoint(api, receiver) -> str:
    created = api.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]
    assert api.post(f"/v0/webhook-endpoints/{created['id']}/verify").status_code == 200
    return created["id"]


def test_a_task_subject_wakes_for_that_task_and_its_discussion_only(space, general, alice, bob, as_alice,
                                                                    endpoint):
    # given
    mine = tasks.create_task(space, title="mine", actor=alice)
    other = tasks.create_task(space, title="other", actor=alice)
    subscription = subscribe(as_alice, endpoint, subjects=[{"type": "task", "id": mine.public_id}])
    activate(as_alice, subscription)
    # when
    tasks.claim_task(space, other.public_id, actor=bob)
    send_message(general, body="elsewhere", actor=bob)
    claimed = tasks.claim_task(space, mine.public_id, actor=bob)
    said = send_message(claimed.conversation, body="starting", actor=bob).message
    # then: one open wake, covering the claim and the message, nothing else
    (wake,) = wakes(subscription)
    assert wake.through_position == said.position
    assert wake.after_position < said.position


@pytest.mark.parametrize("subject", ["tsk_aaaaaaaaaaaaaaaa", "TSK_AAAAAAAAAAAAAAAA"])
def test_an_unknown_task_subject_is_404(space, as_alice, endpoint, subject):
    # when
    response = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                             {"endpoint_id": endpoint, "subjects": [{"type": "task", "id": subject}]})
    # then
    assert response.status_code == 404 and error_code(response) == "NOT_FOUND"


def test_a_checkin_wakes_the_claimants_subscriptions_and_nobody_elses(space, alice, bob, as_alice, as_bob,
                                                                     receiver):
    # given: alice and bob each watch the whole space; bob claims a task
    start = now()
    with freeze(start):
        task = tasks.create_task(space, title="Report", actor=alice)
        tasks.claim_task(space, task.public_id, actor=bob)
    watching = {who: subscribe(api, verified_endpoint(api, receiver), debounce_ms=0)
                for who, api in (("alice", as_alice), ("bob", as_bob))}
    for who, api in (("alice", as_alice), ("bob", as_bob)):
        activate(api, watching[who])
    # when
    with freeze(start + dt.timedelta(hours=18)):
        assert claims.scan()["checkins"] == 1
    # then
    assert len(wakes(watching["bob"])) == 1 and wakes(watching["alice"]) == []
