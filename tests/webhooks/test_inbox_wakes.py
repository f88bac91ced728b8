"""What an inbox subscription wakes for beyond a message addressed to its
owner: a firewall's release (`message.admitted`), and nothing while the
firewall holds the message (SPEC §7, §8)."""
import pytest

from inbox import firewall
from inbox.models import InboxItem
from tests.webhooks.scene import pump
from tests.webhooks.conftest import pushes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def test_a_held_message_wakes_nothing_and_its_release_wakes_with_its_admission(cell, receiver):
    # given: alice's inbox subscription, and a firewall that holds what says "secret"
    world = cell("inbox")
    alice = world["alice"]
    firewall.set_rules(alice, [{"action": "hold", "content_pattern": "secret"}], actor=alice)
    # when: bob's message is held
    sent = world["send"]("the secret")
    firewall.classify_pending(alice.pk)
    pump()
    # then: nothing addressed to her yet, so no wake
    held = InboxItem.objects.get(member=alice, message=sent.message)
    assert held.admission == "held" and pushes(receiver) == []
    # when: she releases it
    firewall.release_item(alice, held.token, actor=alice)
    pump()
    # then: one wake, whose range holds its admission
    (wake,) = [request.json() for request in pushes(receiver)]
    events = world["as_alice"].get("/v0/me/inbox/events", cursor=wake["event_range"]["after"]).json()["events"]
    assert [(e["kind"], e["data"]["message"]["id"]) for e in events] == [("message.admitted", sent.message.public_id)]
