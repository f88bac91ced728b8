"""SPEC §7, inbox firewall, while things change around waiting items:
rules cleared with items still waiting (order within a conversation), a
member removed or suspended before their items are judged, and the flag
that says whether new items wait, and rules replaced twice at once."""
import pytest
from rest_framework.test import APIClient

from controlplane import bearer, services
from controlplane.models import EventAddressee
from inbox import delivery, firewall
from inbox.models import FirewallRule, InboxItem, Mailbox, MailboxShare
from inbox.services import send_message
from tests.conftest import at_once, error_code, meeting_point
from tests.inbox.test_firewall import inbox_contents


def test_items_sent_after_the_rules_are_cleared_are_judged_after_those_waiting(space, alice, bob, as_bob,
                                                                                 monkeypatch):
    # given: an item waiting for the firewall, its kick lost; then the rules cleared, their kick lost too
    for where in ("inbox.writes", "inbox.firewall"):
        monkeypatch.setattr(f"{where}.kick_once_on_commit", lambda *a: None)
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow", "guidance": "ok"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="m1", actor=alice)
    as_bob.put("/v0/me/inbox/firewall", {"rules": []})
    # when: a later item of the same conversation comes
    send_message(direct, body="m2", actor=alice)
    # then: it waits its turn behind the first, on every path that hands items out
    assert InboxItem.objects.get(member=bob, message__body="m2").admission == "unclassified"
    assert inbox_contents(as_bob) == [] and not delivery.deliverable(bob.pk).exists()
    firewall.classify_pending(bob.pk)
    assert inbox_contents(as_bob) == [("m1", None), ("m2", None)]
    # and once none waits, new items are admitted at once again
    send_message(direct, body="m3", actor=alice)
    assert InboxItem.objects.get(member=bob, message__body="m3").admission == "admitted"


def test_an_admitted_item_never_overtakes_an_earlier_one_still_unjudged(space, alice, bob, as_bob, monkeypatch):
    # given: the state a send racing the flag's clearing leaves: an unjudged item, and the flag off
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="m1", actor=alice)
    Mailbox.objects.filter(member=bob).update(firewall=False)
    send_message(direct, body="m2", actor=alice)
    # then: the later one, admitted at once, waits behind it
    assert InboxItem.objects.get(member=bob, message__body="m2").admission == "admitted"
    assert inbox_contents(as_bob) == [] and not delivery.deliverable(bob.pk).exists()
    firewall.classify_pending(bob.pk)
    assert [content for content, _ in inbox_contents(as_bob)] == ["m1", "m2"]


def test_clearing_the_rules_judges_the_items_waiting_at_once(space, alice, bob, as_bob, monkeypatch,
                                                             django_capture_on_commit_callbacks):
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)  # only the one set_rules makes
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow", "guidance": "ok"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="m1", actor=alice)
    with django_capture_on_commit_callbacks(execute=True):
        as_bob.put("/v0/me/inbox/firewall", {"rules": []})
    send_message(direct, body="m2", actor=alice)
    assert inbox_contents(as_bob) == [("m1", None), ("m2", None)]


def private_direct(alice, bob):
    """A private space of alice's with bob in it, and their direct conversation there."""
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="open", actor=alice)
    services.add_member(vault, bob, actor=alice)
    return vault, services.get_or_create_direct(vault, bob, actor=alice)[0]


def test_a_member_removed_from_a_private_space_reads_none_of_its_admissions(alice, bob, as_bob, monkeypatch):
    # given: bob's inbox subscription, his firewall, and a private space he is in
    from controlplane.models import LogHead
    from webhooks.models import Delivery, Endpoint, Subscription
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)
    Subscription.objects.create(owner=bob, endpoint=Endpoint.objects.create(owner=bob, url="https://hooks.example/b"),
                                kind=Subscription.Kind.INBOX, status=Subscription.Status.ACTIVE, debounce_ms=0,
                                activation_position=LogHead.objects.get().position)
    firewall.set_rules(bob, [{"action": "allow", "guidance": "fine"}], actor=bob)
    vault, direct = private_direct(alice, bob)
    send_message(direct, body="admitted before", actor=alice)
    firewall.classify_pending(bob.pk)
    def bodies():
        events = as_bob.get("/v0/me/inbox/events").json()["events"]
        return [e["data"]["message"]["body"] for e in events if e["kind"] == "message.admitted"]

    assert bodies() == ["admitted before"]
    send_message(direct, body="classified after", actor=alice)
    wakes = Delivery.objects.count()
    # when: alice removes bob before the second is classified
    services.remove_member(vault, bob, actor=alice)
    firewall.classify_pending(bob.pk)
    # then: his inbox feed shows neither body, and nothing woke him
    assert bodies() == []
    assert Delivery.objects.count() == wakes
    assert not EventAddressee.objects.filter(member=bob, event__kind="message.admitted",
                                             event__data__message__body="classified after").exists()


def test_an_item_judged_after_its_member_left_a_private_space_is_rejected(alice, bob, as_bob):
    # given: two items of a private space for bob: one his firewall held, one still waiting for it
    firewall.set_rules(bob, [{"action": "hold", "content_pattern": "held"}], actor=bob)
    vault, direct = private_direct(alice, bob)
    send_message(direct, body="held before", actor=alice)
    firewall.classify_pending(bob.pk)
    send_message(direct, body="vault secret", actor=alice)
    # when: bob is removed, then the firewall judges the second
    services.remove_member(vault, bob, actor=alice)
    firewall.classify_pending(bob.pk)
    # then: nothing reaches him after his removal; the one rejected leaves his mailbox and alice's share
    late = InboxItem.objects.get(member=bob, message__body="vault secret")
    assert late.state == "rejected" and inbox_contents(as_bob) == []
    assert "vault secret" not in str(as_bob.get(f"/v0/inbox-events/evt_{late.token[4:]}").json())
    assert Mailbox.objects.get(member=bob).pending_bytes == 0
    held = InboxItem.objects.get(member=bob, message__body="held before")
    assert MailboxShare.objects.get(member=bob, sender=alice).pending_bytes == held.content_bytes
    # and what was held before the removal stays his, as admitted items do
    assert [e["item"]["content"] for e in as_bob.get("/v0/me/inbox/held").json()["items"]] == ["held before"]
    refused = as_bob.post("/v0/me/inbox/held/release", {"deliveryToken": late.token})
    assert refused.status_code == 404 and error_code(refused) == "UNKNOWN_DELIVERY"


def test_an_item_judged_while_its_member_is_suspended_is_judged_as_anyones(space, alice, bob, as_bob, monkeypatch):
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="allowed", actor=alice)
    services.update_member(bob, status="suspended", actor=None)
    firewall.classify_pending(bob.pk)
    services.update_member(bob, status="active", actor=None)
    assert InboxItem.objects.get(member=bob).admission == "admitted"
    # and its admission reaches his inbox feed once he is back, as any other does
    events = as_bob.get("/v0/me/inbox/events").json()["events"]
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.admitted"] == ["allowed"]


def test_the_sweep_turns_off_the_flag_of_a_member_with_no_rules_and_nothing_waiting(space, alice, bob,
                                                                                   monkeypatch):
    # given: rules cleared while an item waited, every kick lost, and the item settled by other means
    for where in ("inbox.writes", "inbox.firewall"):
        monkeypatch.setattr(f"{where}.kick_once_on_commit", lambda *a: None)
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="m1", actor=alice)
    firewall.set_rules(bob, [], actor=bob)
    InboxItem.objects.filter(member=bob).update(state="rejected", admission="withheld")  # as a barrier leaves it
    # when
    from inbox.tasks import classify_all
    classify_all()
    # then: bob's next items are admitted at once again
    assert Mailbox.objects.get(member=bob).firewall is False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_replacements_of_the_rules_at_once_take_turns(monkeypatch):
    # given a member with a mailbox, and two replacements that meet once each has deleted the rules it saw
    # (unless one waits for the other, which breaks the meeting)
    bob = services.create_member("bob", actor=None)
    _, token = bearer.issue_credential(bob, actor=None)
    Mailbox.objects.create(member=bob)
    both_deleted, bulk_create = meeting_point(), FirewallRule.objects.bulk_create

    def meeting_then_create(rules, *args, **kwargs):
        rules = list(rules)
        both_deleted()
        return bulk_create(rules, *args, **kwargs)

    monkeypatch.setattr(FirewallRule.objects, "bulk_create", meeting_then_create)

    def put(pattern):
        rules = {"rules": [{"action": "hold", "content_pattern": pattern}]}
        return lambda: APIClient().put("/v0/me/inbox/firewall", rules, format="json",
                                       HTTP_AUTHORIZATION=f"Bearer {token}").status_code

    statuses = at_once(put("alpha"), put("beta"))
    # then both are answered (one collided on the rules' order: a 500) and one set of rules stands
    assert statuses == [200, 200]
    assert FirewallRule.objects.filter(member=bob).count() == 1
