"""A claim's room is shared between members (webhooks.engine.PER_OWNER):
the per-endpoint bound alone let one member, whose 20 endpoints may all
share one URL, take a worker's whole room with slow receivers; and an
endpoint gets at most PER_ENDPOINT places, those in flight counted."""
import collections
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import now
from webhooks import engine
from webhooks.models import Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def due_wakes(owner, endpoints, subscriptions: int, *, ago: int) -> list[Subscription]:
    """`subscriptions` space subscriptions of `owner`'s, over `endpoints`, each with a wake due `ago` seconds ago."""
    spaces = [services.create_space(slug=f"{owner.handle}{n}", name="S", visibility="open", send_policy="open",
                                    actor=owner) for n in range((subscriptions + 19) // 20)]
    made = []
    for n in range(subscriptions):
        subscription = Subscription.objects.create(owner=owner, endpoint=endpoints[n % len(endpoints)], kind="space",
                                                   space=spaces[n // 20], status="active", activation_position=0,
                                                   debounce_ms=0)
        Delivery.objects.create(subscription=subscription, after_position=0, through_position=1, state="pending",
                                due_at=now() - dt.timedelta(seconds=ago))
        made.append(subscription)
    return made


def test_one_member_takes_at_most_their_share_of_a_claim_and_none_while_it_is_in_flight(make_member):
    # given: mallory's 80 due wakes over 20 endpoints on one URL (within the API's limits), due first; then bob's
    mallory, bob = make_member("mallory"), make_member("bob")
    slow = [Endpoint.objects.create(owner=mallory, url="https://slow.example/hook") for _ in range(20)]
    due_wakes(mallory, slow, 80, ago=5)
    (bobs,) = due_wakes(bob, [Endpoint.objects.create(owner=bob, url="https://fast.example/hook")], 1, ago=1)
    # when: a worker claims its whole room
    first = engine.claim_due(engine.MAX_IN_FLIGHT)
    # then: mallory's share is PER_OWNER, and bob's wake is claimed with it
    claimed = Subscription.objects.filter(public_id__in=[j.subscription_id for j in first])
    assert claimed.filter(owner=mallory).count() == engine.PER_OWNER
    assert bobs in claimed
    # when: another claim comes while mallory's are in flight
    second = engine.claim_due(engine.MAX_IN_FLIGHT)
    # then: none of hers; once they are done, her next share is claimed
    assert second == []
    Delivery.objects.filter(state="sending").update(state="delivered", claimed_until=None)
    third = engine.claim_due(engine.MAX_IN_FLIGHT)
    assert len(third) == min(engine.PER_OWNER, 80 - engine.PER_OWNER)
    assert not {j.delivery_id for j in first} & {j.delivery_id for j in third}


def test_an_endpoint_gets_at_most_its_places_whatever_is_in_flight_to_it(make_member):
    # given 12 due wakes of one member to one endpoint, and 12 to another, one of whose wakes is in flight
    olive = make_member("olive")
    one, other = (Endpoint.objects.create(owner=olive, url=f"https://{name}.example/hook") for name in ("one", "other"))
    due_wakes(olive, [one, other], 24, ago=5)
    Delivery.objects.filter(pk=Delivery.objects.filter(subscription__endpoint=other).order_by("pk")[0].pk).update(
        state="sending", claimed_until=now() + dt.timedelta(minutes=1))
    # when a worker claims its whole room
    jobs = engine.claim_due(engine.MAX_IN_FLIGHT)
    # then each endpoint has PER_ENDPOINT in flight, not one claim's whole share of its member
    per_endpoint = collections.Counter(Delivery.objects.filter(state="sending").values_list(
        "subscription__endpoint_id", flat=True))
    assert per_endpoint == {one.pk: engine.PER_ENDPOINT, other.pk: engine.PER_ENDPOINT}
    assert len(jobs) == 2 * engine.PER_ENDPOINT - 1
    # and once they are answered, the next ones are claimed
    Delivery.objects.filter(state="sending").update(state="delivered", claimed_until=None)
    assert len(engine.claim_due(engine.MAX_IN_FLIGHT)) == 2 * engine.PER_ENDPOINT
