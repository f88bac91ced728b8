"""Space and inbox subscriptions and the outbox (SPEC §8)."""
import pytest
from django.db import transaction

from controlplane import services
from controlplane.cursors import caller_id, pack_cursor
from controlplane.log import log_head
from controlplane.tracing import begin_request, end_request
from inbox.services import send_message
from tests.conftest import error_code
from webhooks.models import Delivery, Subscription


@pytest.fixture
def endpoint(receiver, as_alice):
    """alice's verified endpoint on the test receiver."""
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]
    assert as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify").status_code == 200
    return endpoint["id"]


def subscribe(api, endpoint_id, slug="lab", **extra):
    response = api.post(f"/v0/spaces/{slug}/webhook-subscriptions", {"endpoint_id": endpoint_id, **extra})
    assert response.status_code == 201, response.json()
    return response.json()["subscription"]


def activate(api, subscription, slug="lab"):
    path = (f"/v0/spaces/{slug}/webhook-subscriptions/{subscription['id']}/activate"
            if subscription["scope"] == "space" else f"/v0/me/inbox-subscriptions/{subscription['id']}/activate")
    response = api.post(path)
    assert response.status_code == 200, response.json()
    return response.json()["activation_cursor"]


def wakes(subscription):
    return list(Delivery.objects.filter(subscription__public_id=subscription["id"]).order_by("id"))


def test_created_inactive_and_only_later_events_qualify(space, general, alice, as_alice, endpoint):
    # given
    subscription = subscribe(as_alice, endpoint, debounce_ms=0)
    send_message(general, body="before", actor=alice)
    # then: created inactive, nothing queued
    assert subscription["status"] == "inactive" and subscription["scope"] == "space" and wakes(subscription) == []
    # when
    cursor = activate(as_alice, subscription)
    head = log_head().position
    later = send_message(general, body="after", actor=alice).message
    # then: one wake, from the activation cursor to the new event
    (wake,) = wakes(subscription)
    assert (wake.after_position, wake.through_position, wake.state) == (head, later.position, "open")
    events = as_alice.get("/v0/spaces/lab/events", cursor=cursor).json()["events"]
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.created"] == ["after"]


def test_events_within_the_window_coalesce_into_one_wake(space, general, alice, as_alice, endpoint):
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    positions = [send_message(general, body=f"{n}", actor=alice).message.position for n in range(5)]
    (wake,) = wakes(subscription)
    assert wake.through_position == positions[-1]


def test_a_frozen_wake_is_followed_by_a_chained_one(space, general, alice, as_alice, endpoint):
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    first = send_message(general, body="1", actor=alice).message
    Delivery.objects.update(state=Delivery.State.SENDING)  # a worker took it
    second = send_message(general, body="2", actor=alice).message
    older, newer = wakes(subscription)
    assert (older.through_position, newer.after_position, newer.through_position) == (
        first.position, first.position, second.position)


def test_filters_exclude_self_subjects_and_private_conversations(space, general, alice, bob, carol, as_alice,
                                                                 endpoint):
    # given: one subscription per filter
    own_excluded = subscribe(as_alice, endpoint, exclude_self=True)
    only_general = subscribe(as_alice, endpoint, subjects=[{"type": "conversation", "id": general.public_id}])
    everything = subscribe(as_alice, endpoint)
    for subscription in (own_excluded, only_general, everything):
        activate(as_alice, subscription)
    other = services.create_channel(space, "other", actor=bob)
    bob_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    # when
    mine = send_message(general, body="mine", actor=alice).message
    elsewhere = send_message(other, body="elsewhere", actor=bob).message
    send_message(bob_carol, body="private", actor=bob)
    # then: each wake covers up to the last event it qualifies for; a direct
    # conversation alice does not take part in wakes none of hers
    assert [w.through_position for w in wakes(own_excluded)] == [elsewhere.position]
    assert [w.through_position for w in wakes(only_general)] == [mine.position]
    assert [w.through_position for w in wakes(everything)] == [elsewhere.position]


def test_inbox_subscriptions_wake_for_what_is_addressed_to_the_owner(space, general, alice, bob, as_alice,
                                                                     endpoint):
    # given
    response = as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint, "debounce_ms": 0})
    subscription = response.json()["subscription"]
    assert response.status_code == 201 and subscription["scope"] == "inbox_events" and "space" not in subscription
    activate(as_alice, subscription)
    # when
    send_message(general, body="no mention", actor=bob)
    mention = send_message(general, body="hey @alice", actor=bob).message
    # then
    (wake,) = wakes(subscription)
    assert wake.through_position == mention.position


def test_a_rolled_back_event_leaves_no_wake(space, general, alice, as_alice, endpoint):
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    with pytest.raises(RuntimeError), transaction.atomic():
        send_message(general, body="never", actor=alice)
        raise RuntimeError
    assert wakes(subscription) == []


def test_activation_needs_a_verified_endpoint(space, receiver, as_alice):
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    subscription = subscribe(as_alice, endpoint)
    response = as_alice.post(f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}/activate")
    assert response.status_code == 409 and error_code(response) == "CONFLICT"


def test_access_rules(alice, bob, as_alice, as_bob, receiver, api_for, make_member):
    # given: an open space bob never joined, and a private one he is not in
    services.create_space(slug="town", name="Town", visibility="open", send_policy="open", actor=alice)
    private = services.create_space(slug="den", name="Den", visibility="private", send_policy="open", actor=alice)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    # then: open spaces without joining; private ones need admission
    assert as_bob.post("/v0/spaces/town/webhook-subscriptions", {"endpoint_id": endpoint}).status_code == 201
    refused = as_bob.post("/v0/spaces/den/webhook-subscriptions", {"endpoint_id": endpoint})
    assert refused.status_code == 404
    services.add_member(private, bob, actor=alice)
    assert as_bob.post("/v0/spaces/den/webhook-subscriptions", {"endpoint_id": endpoint}).status_code == 201
    # someone else's endpoint is not found
    foreign = as_alice.post("/v0/spaces/town/webhook-subscriptions", {"endpoint_id": endpoint})
    assert foreign.status_code == 404


def test_a_member_removed_from_a_private_space_still_manages_their_subscriptions_to_it(alice, bob, as_bob,
                                                                                       receiver, as_alice):
    # given: bob's subscription to a private space, and then his removal from it
    private = services.create_space(slug="den", name="Den", visibility="private", send_policy="open", actor=alice)
    services.add_member(private, bob, actor=alice)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    assert as_bob.post(f"/v0/webhook-endpoints/{endpoint}/verify").status_code == 200
    mine = subscribe(as_bob, endpoint, slug="den")
    services.remove_member(private, bob, actor=alice)
    path = f"/v0/spaces/den/webhook-subscriptions/{mine['id']}"
    # then: he reads and deletes it (it counted against his limit), and cannot activate it
    assert as_bob.get(path).status_code == 200
    assert error_code(as_bob.post(f"{path}/activate")) == "NOT_FOUND"
    assert as_bob.delete(path).status_code == 204
    assert Subscription.objects.get(public_id=mine["id"]).status == "deleted"
    # and nobody else reaches it, nor reaches it under another space's slug
    assert as_alice.get(path).status_code == 404
    assert as_bob.get(f"/v0/spaces/lab/webhook-subscriptions/{mine['id']}").status_code == 404


@pytest.mark.parametrize("visibility, refused", [("private", "NOT_FOUND"), ("open", "FORBIDDEN")])
def test_a_removed_members_subscriptions_to_the_space_wake_for_nothing_until_they_are_back(
        alice, bob, as_bob, receiver, visibility, refused):
    # given: two subscriptions of bob's to a space of alice's, one active and one he paused
    room = services.create_space(slug="den", name="Den", visibility=visibility, send_policy="open", actor=alice)
    services.add_member(room, bob, actor=alice)
    channel = services.create_channel(room, "plans", actor=alice)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    assert as_bob.post(f"/v0/webhook-endpoints/{endpoint}/verify").status_code == 200
    active, paused = (subscribe(as_bob, endpoint, slug="den", debounce_ms=0) for _ in range(2))
    for subscription in (active, paused):
        activate(as_bob, subscription, slug="den")
    paused_path = f"/v0/spaces/den/webhook-subscriptions/{paused['id']}"
    assert as_bob.patch(paused_path, {"status": "paused"}).status_code == 200
    # when: he is removed, and alice goes on writing
    services.remove_member(room, bob, actor=alice)
    for n in range(3):
        send_message(channel, body=f"plan {n}", actor=alice)
    # then: no wake opened, cancelled or not (their times in his history told him when the space was busy)
    assert wakes(active) == []
    # and he cannot resume the paused one, as he cannot activate one (resuming was taken)
    resumed = as_bob.patch(paused_path, {"status": "active"})
    assert error_code(resumed) == refused and Subscription.objects.get(public_id=paused["id"]).status == "paused"
    # but back in the space, the active one wakes again, and he resumes the other
    services.add_member(room, bob, actor=alice)
    send_message(channel, body="welcome back", actor=alice)
    assert len(wakes(active)) == 1
    assert as_bob.patch(paused_path, {"status": "active"}).json()["subscription"]["status"] == "active"


def test_a_member_who_left_and_asks_to_join_again_gets_no_wake_while_pending(alice, bob, as_bob, receiver):
    # given: bob's active subscription to a request space he then left
    room = services.create_space(slug="den", name="Den", visibility="request", send_policy="open", actor=alice)
    services.add_member(room, bob, actor=alice)
    channel = services.create_channel(room, "plans", actor=alice)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    assert as_bob.post(f"/v0/webhook-endpoints/{endpoint}/verify").status_code == 200
    mine = subscribe(as_bob, endpoint, slug="den", debounce_ms=0)
    activate(as_bob, mine, slug="den")
    services.remove_member(room, bob, actor=bob)
    # when: he asks to join again, and alice writes while his request waits
    assert services.join_space(room, actor=bob).membership.status == "pending"
    for n in range(3):
        send_message(channel, body=f"plan {n}", actor=alice)
    # then: pending is not back (his wakes were opened again, and cancelled in his history)
    assert wakes(mine) == []
    # and once admitted, they wake again
    services.add_member(room, bob, actor=alice)
    send_message(channel, body="welcome", actor=alice)
    assert len(wakes(mine)) == 1


@pytest.mark.parametrize("body", [
    {"subjects": [{"type": "project", "id": "tsk_aaaaaaaaaaaaaaaa"}]},
    {"debounce_ms": 60_001}, {"debounce_ms": -1}, {"debounce_ms": "100"}, {"exclude_self": "yes"},
    {"subjects": [{"type": "conversation"}]}, {"filter": "all"},
])
def test_bad_subscriptions_are_400(space, as_alice, endpoint, body):
    response = as_alice.post("/v0/spaces/lab/webhook-subscriptions", {"endpoint_id": endpoint, **body})
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Subscription.objects.exists()


def test_subjects_must_be_visible_conversations_of_the_space(space, bob, carol, as_alice, endpoint):
    bob_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    response = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                             {"endpoint_id": endpoint, "subjects": [{"type": "conversation",
                                                                     "id": bob_carol.public_id}]})
    assert response.status_code == 404 and not Subscription.objects.exists()


def test_a_subscription_lists_each_subject_once(space, general, as_alice, endpoint):
    # twenty copies of one subject were stored and shown
    subject = {"type": "conversation", "id": general.public_id}
    response = as_alice.post("/v0/spaces/lab/webhook-subscriptions", {"endpoint_id": endpoint,
                                                                       "subjects": [subject, subject]})
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Subscription.objects.exists()


def test_limits(space, alice, as_alice, endpoint):
    for _ in range(20):
        subscribe(as_alice, endpoint)
    per_space = as_alice.post("/v0/spaces/lab/webhook-subscriptions", {"endpoint_id": endpoint})
    assert per_space.status_code == 409 and error_code(per_space) == "LIMIT_EXCEEDED"
    for _ in range(20):
        assert as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint}).status_code == 201
    inbox = as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint})
    assert inbox.status_code == 409
    # deleted subscriptions do not count
    first = Subscription.objects.filter(kind="inbox").first()
    assert as_alice.delete(f"/v0/me/inbox-subscriptions/{first.public_id}").status_code == 204
    assert as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint}).status_code == 201
    # 100 in total
    endpoint_row = Subscription.objects.first().endpoint
    Subscription.objects.bulk_create(Subscription(owner=alice, endpoint=endpoint_row, kind="inbox")
                                     for _ in range(60))
    total = as_alice.post("/v0/spaces/lab/webhook-subscriptions", {"endpoint_id": endpoint})
    assert Subscription.objects.exclude(status="deleted").count() == 100
    assert total.status_code == 409 and "100" in total.json()["error"]["message"]


def test_pause_then_resume_sends_a_catch_up_wake(space, general, alice, as_alice, endpoint):
    # given: a delivered wake, then a pause
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    first = send_message(general, body="1", actor=alice).message
    Delivery.objects.update(state=Delivery.State.DELIVERED)
    path = f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}"
    paused = as_alice.patch(path, {"status": "paused"}).json()["subscription"]
    # when: events arrive while paused
    missed = send_message(general, body="2", actor=alice).message
    assert len(wakes(subscription)) == 1
    resumed = as_alice.patch(path, {"status": "active"}).json()["subscription"]
    # then: one catch-up wake chained to the last one, due at once
    assert paused["status"] == "paused" and resumed["status"] == "active"
    assert resumed["version"] > paused["version"] > subscription["version"]
    catch_up = wakes(subscription)[-1]
    assert (catch_up.after_position, catch_up.through_position) == (first.position, missed.position)


def test_delete_cancels_unsent_wakes(space, general, alice, as_alice, endpoint):
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    send_message(general, body="1", actor=alice)
    path = f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}"
    assert as_alice.delete(path).status_code == 204
    assert [w.state for w in wakes(subscription)] == ["cancelled"]
    assert as_alice.get(path).status_code == 404
    send_message(general, body="2", actor=alice)
    assert len(wakes(subscription)) == 1


def test_history_and_replay_are_the_owners(space, general, alice, as_alice, as_bob, endpoint):
    # given: a delivered wake
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    send_message(general, body="1", actor=alice)
    Delivery.objects.update(state=Delivery.State.DELIVERED)
    history_path = f"/v0/webhook-subscriptions/{subscription['id']}/deliveries"
    (delivery,) = as_alice.get(history_path).json()["deliveries"]
    # when
    replayed = as_alice.post(f"/v0/webhook-deliveries/{delivery['id']}/replay")
    # then: the same range again under a new id, due now
    assert replayed.status_code == 202
    copy = Delivery.objects.get(public_id=replayed.json()["delivery"]["id"])
    original = Delivery.objects.get(public_id=delivery["id"])
    assert (copy.after_position, copy.through_position, copy.state) == (
        original.after_position, original.through_position, "pending")
    assert as_bob.get(history_path).status_code == 404
    assert as_bob.post(f"/v0/webhook-deliveries/{delivery['id']}/replay").status_code == 404


def delivered_wake(api, endpoint, conversation, author):
    """An active subscription of `api`'s member to the space, and its one wake, delivered."""
    subscription = subscribe(api, endpoint)
    activate(api, subscription)
    send_message(conversation, body="1", actor=author)
    Delivery.objects.update(state=Delivery.State.DELIVERED)
    (delivery,) = Delivery.objects.all()
    return subscription, delivery


def test_replays_wait_only_on_an_active_subscription_and_only_so_many(space, general, alice, as_alice, endpoint,
                                                                       monkeypatch):
    # given: a delivered wake of an active subscription, room for two unsent replays
    from webhooks import services as webhooks_services

    monkeypatch.setattr(webhooks_services, "MAX_UNFINISHED_REPLAYS", 2)
    subscription, delivery = delivered_wake(as_alice, endpoint, general, alice)
    replay = f"/v0/webhook-deliveries/{delivery.public_id}/replay"
    # when
    answers = [as_alice.post(replay) for _ in range(3)]
    Delivery.objects.filter(replay_of=delivery).update(state=Delivery.State.DELIVERED)  # sent meanwhile
    after_sent = as_alice.post(replay)
    as_alice.patch(f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}", {"status": "paused"})
    paused = as_alice.post(replay)
    # then
    assert [a.status_code for a in answers] == [202, 202, 409]
    assert answers[2].json()["error"]["code"] == "LIMIT_EXCEEDED"
    assert after_sent.status_code == 202
    assert (paused.status_code, paused.json()["error"]["details"]) == (409, {"status": "paused"})
    assert Delivery.objects.filter(replay_of=delivery).count() == 3


def test_a_keyed_replay_retried_sends_one_wake(space, general, alice, as_alice, endpoint):
    # given: a delivered wake
    _, delivery = delivered_wake(as_alice, endpoint, general, alice)
    replay = f"/v0/webhook-deliveries/{delivery.public_id}/replay"
    # when
    malformed = as_alice.post(replay, headers={"Idempotency-Key": "short"})
    first = as_alice.post(replay, headers={"Idempotency-Key": "replay-0001"})
    retry = as_alice.post(replay, headers={"Idempotency-Key": "replay-0001"})
    # then: one new wake, and the retry answers it again
    assert malformed.status_code == 400 and error_code(malformed) == "INVALID_IDEMPOTENCY_KEY"
    assert first.status_code == retry.status_code == 202 and retry.json() == first.json()
    assert Delivery.objects.filter(replay_of=delivery).count() == 1


def test_a_malformed_key_activates_nothing_and_a_keyed_retry_answers_the_same_cursor(space, general, alice,
                                                                                     as_alice, endpoint):
    # given
    subscription = subscribe(as_alice, endpoint)
    path = f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}/activate"
    # when
    malformed = as_alice.post(path, headers={"Idempotency-Key": "short"})
    status = Subscription.objects.get().status
    first = as_alice.post(path, headers={"Idempotency-Key": "activate-01"})
    retry = as_alice.post(path, headers={"Idempotency-Key": "activate-01"})
    # then
    assert malformed.status_code == 400 and error_code(malformed) == "INVALID_IDEMPOTENCY_KEY"
    assert status == "inactive"
    assert first.status_code == 200 and retry.json() == first.json()


def test_the_activation_cursor_reads_the_owners_feed(space, general, alice, as_alice, endpoint):
    subscription = subscribe(as_alice, endpoint)
    cursor = activate(as_alice, subscription)
    position = Subscription.objects.get().activation_position
    assert cursor == pack_cursor((position,), caller=caller_id(alice), stream=f"space:{space.public_id}")


def test_a_wake_keeps_the_request_ids_of_its_first_sends_that_fit(space, general, alice, as_alice, endpoint):
    # given
    subscription = subscribe(as_alice, endpoint)
    activate(as_alice, subscription)
    request_ids = [f"{n:02d}-" + "x" * 29 for n in range(40)]  # 32 characters each
    # when: forty sends in one debounce window, each under its request id
    for request_id in request_ids:
        _, token = begin_request(request_id)
        try:
            last = send_message(general, body="tick", actor=alice).message
        finally:
            end_request(token)
    # then: one wake through the last event, naming the first fifteen (fifteen fit in 512 characters)
    (wake,) = wakes(subscription)
    assert wake.through_position == last.position
    assert wake.request_ids.split() == request_ids[:15] and len(wake.request_ids) <= 512
