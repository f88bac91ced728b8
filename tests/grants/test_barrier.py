"""The revocation barrier and expiry (SPEC §5)."""
import datetime as dt
import json
import signal
import subprocess
import sys

import pytest
from django_q.models import Schedule
from django_q.scheduler import scheduler

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.schedules import ensure_schedules
from grants import barrier
from grants.models import Grant
from inbox import firewall
from inbox.delivery import pending_count
from inbox.models import InboxItem, Mailbox, MailboxShare, Recipient
from tests.conftest import error_code
from tests.grants.conftest import send_path
from tests.servers import ROOT, manage, server_env
from web import messages
from web.streams import read_pass


def send(api, conversation, body, key=None):
    response = api.post(send_path(conversation), {"body": body}, headers={"Idempotency-Key": key} if key else None)
    assert response.status_code == 201, response.json()
    return response.json()["message"]["id"]


def inbox(api):
    return api.get("/v0/me/inbox").json()["items"]


def summary(api):
    """carol's inbox as (kind, message id) pairs, in order."""
    return [(e["item"]["kind"], e["item"]["postId"]) for e in inbox(api)]


def test_finishing_keeps_what_was_handed_off_and_rejects_the_rest(bob_to_carol, grant, as_alice, as_bob, as_carol,
                                                                  carol):
    # given: two messages under a pair grant; carol has acknowledged the first
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    handed_off, pending = send(as_bob, bob_to_carol, "one"), send(as_bob, bob_to_carol, "two")
    first, second = inbox(as_carol)
    as_carol.post("/v0/me/inbox/acknowledge", {"deliveryToken": first["deliveryToken"]})
    # when
    revoked = as_alice.post("/v0/grants/grt_pair/revoke").json()["grant"]
    # then: the grant is terminal
    assert revoked["status"] == "revoked"
    # the acknowledged item stays delivered; the pending one is a tombstone
    # whose place a `rejected` notice takes
    assert summary(as_carol) == [("rejected", pending)]
    notice = inbox(as_carol)[0]["item"]
    assert notice["grant"] == "grt_pair" and "was revoked" in notice["reason"] and "content" not in notice
    kept = as_carol.get(f"/v0/inbox-events/evt_{first['deliveryToken'][4:]}").json()
    assert kept == {"item": first["item"]}
    tombstone = as_carol.get(f"/v0/inbox-events/evt_{second['deliveryToken'][4:]}").json()
    assert tombstone["state"] == "rejected" and "content" not in tombstone["item"]
    assert tombstone["item"]["postId"] == pending and tombstone["reason"] == notice["reason"]
    # terminal status stays visible to the participants, as audit
    for caller in (as_bob, as_carol):
        status = caller.get(f"/v0/messages/{pending}").json()["message"]["recipients"][0]
        assert status["state"] == "rejected" and status["reason"] == notice["reason"]
    assert as_carol.get(f"/v0/messages/{handed_off}").json()["message"]["recipients"][0]["state"] == "pending"
    # revoked authority restores no body access, nor handling
    for message_id in (handed_off, pending):
        body = as_carol.get(f"/v0/messages/{message_id}/body")
        assert body.status_code == 403 and error_code(body) == "AUTHORITY_REVOKED"
    ack = as_carol.post(f"/v0/messages/{handed_off}/acknowledge")
    assert ack.status_code == 403 and error_code(ack) == "AUTHORITY_REVOKED"
    # the withdrawn item's token is still carol's: acknowledging it is a no-op, not an unknown token
    withdrawn = as_carol.post("/v0/me/inbox/acknowledge", {"deliveryToken": second["deliveryToken"]})
    assert (withdrawn.status_code, withdrawn.json()) == (200, {})
    assert as_carol.get(f"/v0/inbox-events/evt_{second['deliveryToken'][4:]}").json()["state"] == "rejected"
    # the pending content left the mailbox count; the notice is all that is pending
    assert Mailbox.objects.get(member=carol).pending_bytes == InboxItem.objects.get(kind="rejected").content_bytes
    # and no new send is admitted under it
    refused = as_bob.post(send_path(bob_to_carol), {"body": "three"})
    assert refused.status_code == 403 and error_code(refused) == "GRANT_REQUIRED"


def test_a_keyed_retry_after_the_revocation_gives_the_original_without_its_body(bob_to_carol, grant, as_alice,
                                                                                 as_bob):
    # given
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message_id = send(as_bob, bob_to_carol, "secret plans", key="plans-0001")
    as_alice.post("/v0/grants/grt_pair/revoke")
    # when: bob retries the send, as a client that never saw its answer would
    retry = as_bob.post(send_path(bob_to_carol), {"body": "secret plans"}, headers={"Idempotency-Key": "plans-0001"})
    # then: the original, as the feeds show it now
    assert retry.status_code == 200
    original = retry.json()["message"]
    assert (original["id"], original["body"], original["body_withheld"]) == (message_id, None, "AUTHORITY_REVOKED")


def test_a_message_acknowledged_but_not_its_inbox_item_is_kept_and_the_barrier_ends(bob_to_carol, grant, as_alice,
                                                                                      as_bob, as_carol):
    """A message-level acknowledgement hands the message off without
    settling its inbox item: the barrier keeps the item, once, and ends
    (it used to find the same pending item in every batch, for ever)."""
    # given
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message = send(as_bob, bob_to_carol, "one")
    assert as_carol.post(f"/v0/messages/{message}/acknowledge").status_code == 200
    # when
    revoked = as_alice.post("/v0/grants/grt_pair/revoke").json()["grant"]
    # then: the grant is terminal and carol still has the item, readable
    assert revoked["status"] == "revoked"
    assert summary(as_carol) == [("direct", message)]
    assert InboxItem.objects.get(grant__public_id="grt_pair").admission == InboxItem.Admission.ADMITTED


def test_a_held_item_whose_message_was_acknowledged_is_settled_and_the_barrier_ends(bob_to_carol, grant, as_alice,
                                                                                   as_bob, as_carol, carol):
    """The same for an item carol's firewall holds: the barrier found it in
    every batch and never ended, and `recover` at a server's start with it."""
    # given: a held item whose message carol acknowledged by its id
    as_carol.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "sender": "@bob"}]})
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message = send(as_bob, bob_to_carol, "held")
    firewall.classify_pending(carol.pk)
    assert as_carol.post(f"/v0/messages/{message}/acknowledge").status_code == 200
    # when
    revoked = as_alice.post("/v0/grants/grt_pair/revoke").json()["grant"]
    # then: the barrier ends; the item is settled as handed off and bob's share of the mailbox freed
    assert revoked["status"] == "revoked"
    item = InboxItem.objects.get(message__public_id=message)
    assert item.state == InboxItem.State.ACKNOWLEDGED
    assert summary(as_carol) == [] and as_carol.get("/v0/me/inbox/held").json()["items"] == []
    assert Mailbox.objects.get(member=carol).pending_bytes == 0
    assert not MailboxShare.objects.filter(member=carol, pending_bytes__gt=0).exists()


def test_feeds_withhold_bodies_once_authority_is_revoked(locked, bob_to_carol, grant, as_alice, as_bob, as_carol):
    # given
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message_id = send(as_bob, bob_to_carol, "secret plans")
    def messages():  # carol's inbox feed, without the grant's own events
        return [e for e in as_carol.get("/v0/me/inbox/events").json()["events"] if not e["kind"].startswith("grant.")]

    before = messages()
    # when
    as_alice.post("/v0/grants/grt_pair/revoke")
    # then: the event keeps its place and metadata, without the body
    after = messages()
    assert before[0]["data"]["message"]["body"] == "secret plans"
    created = after[0]["data"]["message"]
    assert (created["id"], created["body"], created["body_withheld"]) == (message_id, None, "AUTHORITY_REVOKED")
    assert [e["kind"] for e in after] == ["message.created", "message.rejected"]
    assert after[1]["data"] == {"message": message_id, "member": "@carol", "reason": after[1]["data"]["reason"]}
    space_feed = as_bob.get("/v0/spaces/vault/events").json()["events"]
    assert [e["data"]["message"]["body"] for e in space_feed if e["kind"] == "message.created"] == [None]
    snapshot = as_carol.get("/v0/me/snapshot").json()
    assert snapshot["unresolved"] == []  # rejected is terminal


def test_a_channel_rejection_names_its_grant_to_its_recipient_alone(locked, grant, as_alice, as_bob, as_carol, bob,
                                                                    api_for, make_member):
    # given: a pair grant with a telling id, a channel message under it, and
    # dan, a member of the space and no party of the grant
    dan = make_member("dan")
    services.join_space(locked, actor=dan)
    grant("grt_bob-may-page-carol-about-incident-42", "pair", sender="@bob", recipient="@carol")
    channel = services.create_channel(locked, "ops", actor=bob)
    message_id = send(as_bob, channel, "@carol deploy now")
    # when
    as_alice.post("/v0/grants/grt_bob-may-page-carol-about-incident-42/revoke")
    # then: carol's notice names it; what every reader of the channel sees does not
    assert inbox(as_carol)[0]["item"]["grant"] == "grt_bob-may-page-carol-about-incident-42"
    as_dan = api_for(dan)
    seen = json.dumps([as_dan.get("/v0/spaces/vault/events").json(), as_dan.get(f"/v0/messages/{message_id}").json()])
    assert "message.rejected" in seen and "was revoked" in seen and "incident-42" not in seen


def test_the_web_app_and_its_live_pass_withhold_bodies_too(locked, bob_to_carol, grant, as_alice, as_bob, carol):
    # given
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    send(as_bob, bob_to_carol, "secret plans")
    def shown():  # the conversation as carol's page, history pager and live socket show it
        page = messages.render_rows(locked.send_policy, messages.before(bob_to_carol.pk, None)[0])
        live = read_pass(bob_to_carol.pk, {carol.pk}, after=0)
        assert live.readers == {carol.pk}
        return [row["html"] for row in page], [json.loads(frame)["html"] for _, frame in live.frames]

    assert all("secret plans" in html for html in sum(shown(), []))
    # when
    as_alice.post("/v0/grants/grt_pair/revoke")
    # then
    page, live = shown()
    assert len(page) == len(live) == 1
    assert all("secret plans" not in html and "Withheld" in html for html in page + live)


def test_an_explicit_only_space_cannot_be_relaxed_so_revoked_bodies_stay_withheld(locked, bob_to_carol, grant, root,
                                                                                   alice, as_alice, as_bob, as_carol,
                                                                                   carol):
    """The read paths look for revoked authority only in explicit_only
    spaces: relaxing one in the admin would have shown the bodies again."""
    from django.test import Client

    # given: a message under a revoked grant
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    send(as_bob, bob_to_carol, "secret plans")
    as_alice.post("/v0/grants/grt_pair/revoke")
    # when: an admin sets the space's policy to open in the admin
    admin = Client()
    admin.force_login(root.user)
    form = {"slug": "vault", "name": "Vault", "visibility": "open", "send_policy": "open", "created_by": alice.pk,
            **{f"memberships-{k}": v for k, v in (("TOTAL_FORMS", 0), ("INITIAL_FORMS", 0))}}
    response = admin.post(f"/admin/controlplane/space/{locked.pk}/change/", form)
    # then: the form says why and changes nothing; every read path still withholds the body
    assert response.status_code == 200 and "stays explicit_only" in response.content.decode()
    locked.refresh_from_db()
    assert locked.send_policy == "explicit_only"
    live = read_pass(bob_to_carol.pk, {carol.pk}, after=0)
    feed = as_carol.get("/v0/me/inbox/events").json()["events"]
    assert "secret plans" not in json.dumps(feed) + "".join(frame for _, frame in live.frames)
    # and: tightening an open space is allowed
    as_alice.post("/v0/spaces", {"slug": "loose", "name": "Loose"})
    form.update(slug="loose", name="Loose", send_policy="explicit_only")
    space_pk = type(locked).objects.get(slug="loose").pk
    assert admin.post(f"/admin/controlplane/space/{space_pk}/change/", form).status_code == 302
    assert type(locked).objects.get(slug="loose").send_policy == "explicit_only"


def test_later_still_authorized_messages_proceed_in_order(bob_to_carol, grant, as_bob, as_carol, carol):
    # given: the first message under a one-message grant, the next under a pair grant
    once = grant("grt_once", "one_message", sender="@bob", recipient="@carol", idempotency_key="key-00001")
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    first = send(as_bob, bob_to_carol, "first", key="key-00001")
    second = send(as_bob, bob_to_carol, "second")
    # when: the barrier starts on the first message's grant
    barrier.start_barrier(once.pk, ending=Grant.Status.REVOKED, actor=None)
    # then: the fenced item is withheld, and the conversation waits behind it, uncounted
    # (every inbox.pending path and the web app's count showed 1 for an inbox that showed nothing)
    assert inbox(as_carol) == [] and pending_count(carol) == 0
    # when: it finishes
    barrier.finish_barrier(once.pk)
    third = send(as_bob, bob_to_carol, "third")
    # then: the rejection takes the first message's place and the rest follow in order
    assert summary(as_carol) == [("rejected", first), ("direct", second), ("direct", third)]
    assert pending_count(carol) == 3


def test_a_revocation_past_its_time_answers_revoking_and_a_worker_finishes_it(bob_to_carol, grant, as_alice, as_bob,
                                                                              as_carol, carol, monkeypatch):
    # given: three pending messages under a pair grant, and no time to settle them in the request
    from grants import tasks
    from mcp_endpoint.server import run_tool

    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    sent = [send(as_bob, bob_to_carol, f"{n}") for n in range(3)]
    read_before = [entry["deliveryToken"] for entry in as_carol.get("/v0/me/inbox").json()["items"]]
    kicked = []
    monkeypatch.setattr(barrier, "INLINE_SECONDS", 0.0)
    monkeypatch.setattr(barrier, "kick", lambda *args: kicked.append(args))
    # when
    answered = as_alice.post("/v0/grants/grt_pair/revoke").json()["grant"]
    # then: fenced (nothing under it is readable or admitted), answered, and a worker asked to finish
    assert answered["status"] == "revoking"
    assert summary(as_carol) == []
    # and a token read before the fence is withheld, not unknown (it was a 404 that said it never was)
    withheld = as_carol.get(f"/v0/inbox-events/evt_{read_before[0][4:]}")
    assert withheld.status_code == 403 and error_code(withheld) == "AUTHORITY_REVOKED"
    # through MCP too: a tool's refusal with the API's body, not the protocol's unknown-event
    refused = run_tool(carol, "read_event", {"eventId": f"evt_{read_before[0][4:]}"})
    assert refused.is_error and refused.structured_content["error"]["code"] == "AUTHORITY_REVOKED"
    assert kicked == [("grants.tasks.finish_barrier", Grant.objects.get().pk)]
    # when: the worker runs
    status = tasks.finish_barrier(*kicked[0][1:])
    # then
    assert status == "revoked" and summary(as_carol) == [("rejected", message) for message in sent]
    assert as_alice.get("/v0/grants/grt_pair").json()["grant"]["status"] == "revoked"


def test_a_send_during_the_barrier_is_refused(bob_to_carol, grant, as_bob):
    pair = grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    barrier.start_barrier(pair.pk, ending=Grant.Status.REVOKED, actor=None)
    response = as_bob.post(send_path(bob_to_carol), {"body": "now?"})
    assert response.status_code == 403 and error_code(response) == "GRANT_REQUIRED"
    assert Grant.objects.get(pk=pair.pk).status == "revoking"


def test_a_held_item_is_rejected_too_and_cannot_be_released(bob_to_carol, grant, as_alice, as_bob, as_carol,
                                                             carol):
    # given: carol's firewall holds bob's message
    as_carol.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "sender": "@bob"}]})
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message_id = send(as_bob, bob_to_carol, "held")
    firewall.classify_pending(carol.pk)
    item = InboxItem.objects.get(message__public_id=message_id)
    token = item.token
    assert item.admission == "held"
    # when
    as_alice.post("/v0/grants/grt_pair/revoke")
    release = as_carol.post("/v0/me/inbox/held/release", {"deliveryToken": token})
    # then
    assert release.status_code == 403 and error_code(release) == "AUTHORITY_REVOKED"
    assert as_carol.get("/v0/me/inbox/held").json()["items"] == []
    assert summary(as_carol) == [("rejected", message_id)]


def test_expiry_runs_the_same_barrier_from_the_schedule(bob_to_carol, grant, as_bob, as_carol):
    # given: a grant that expires in a minute, with a message pending under it
    grant("grt_brief", "pair", sender="@bob", recipient="@carol", expires_at=now() + dt.timedelta(minutes=1))
    message_id = send(as_bob, bob_to_carol, "quick")
    ensure_schedules()
    assert Schedule.objects.get(name="expire-grants").func == "grants.tasks.expire_and_recover"
    Schedule.objects.exclude(name="expire-grants").delete()  # this test runs that one alone
    # when: the django-q2 scheduler runs after the expiry
    with freeze(now() + dt.timedelta(minutes=2)):
        scheduler()
    # then
    expired = Grant.objects.get(public_id="grt_brief")
    assert expired.status == "expired" and expired.barrier_started_by is None
    assert summary(as_carol) == [("rejected", message_id)]
    assert "expired" in inbox(as_carol)[0]["item"]["reason"]


def test_workers_recover_barriers_when_they_start(bob_to_carol, grant, as_bob, as_carol):
    # given: a barrier started and never finished
    pair = grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message_id = send(as_bob, bob_to_carol, "limbo")
    barrier.start_barrier(pair.pk, ending=Grant.Status.REVOKED, actor=None)
    # when: a django-q2 worker process starts
    from django_q.signals import post_spawn
    post_spawn.send(sender="django_q", proc_name="Process-1")
    # then
    assert Grant.objects.get(pk=pair.pk).status == "revoked"
    assert summary(as_carol) == [("rejected", message_id)]


KILL_BETWEEN_STEPS = """
import os, signal
from grants import barrier
from grants.models import Grant
grant = Grant.objects.get(public_id="grt_pair")
barrier.start_barrier(grant.pk, ending="revoked", actor=None)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.django_db(transaction=True)
def test_recover_finishes_a_barrier_whose_process_was_killed_between_its_steps(bob_to_carol, grant, as_bob,
                                                                               as_carol, carol):
    # given: a message pending under a pair grant
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    message_id = send(as_bob, bob_to_carol, "in flight")
    # when: a process starts the barrier and is killed before finishing it
    killed = subprocess.run([sys.executable, "manage.py", "shell", "-c", KILL_BETWEEN_STEPS], cwd=ROOT,
                            env=server_env(), capture_output=True, text=True, timeout=60)
    # then: the fence is durable
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert Grant.objects.get(public_id="grt_pair").status == "revoking"
    assert InboxItem.objects.get(member=carol).admission == "withheld"
    assert inbox(as_carol) == []
    # when: recovery runs (as it does before workers and servers start)
    output = manage("recover")
    # then
    assert output.strip() == "Finished 1 interrupted barrier(s); expired 0 grant(s)."
    assert Grant.objects.get(public_id="grt_pair").status == "revoked"
    assert summary(as_carol) == [("rejected", message_id)]
    assert Recipient.objects.get(member=carol).state == "rejected"


def test_a_held_item_leaves_the_held_list_while_its_grant_is_being_revoked(locked, bob_to_carol, grant, alice, carol,
                                                                           as_bob, as_carol):
    """A barrier withholds admitted items at once and settles held ones
    when it finishes: until then the held list showed the body."""
    # given: carol's firewall holds bob's message, sent under a pair grant
    pair = grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    as_carol.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "sender": "@bob"}]})
    send(as_bob, bob_to_carol, "the launch code is 1234")
    firewall.classify_pending(carol.pk)
    held = as_carol.get("/v0/me/inbox/held").json()["items"]
    assert [i["item"]["content"] for i in held] == ["the launch code is 1234"]
    # when: the revocation starts; a worker finishes it later
    barrier.start_barrier(pair.pk, ending=Grant.Status.REVOKED, actor=alice)
    # then: the held list no longer shows it, and it cannot be released
    assert as_carol.get("/v0/me/inbox/held").json()["items"] == []
    released = as_carol.post("/v0/me/inbox/held/release", {"deliveryToken": held[0]["deliveryToken"]})
    assert released.status_code == 403 and error_code(released) == "AUTHORITY_REVOKED"
    # and once the barrier settles it, it is rejected, not held
    barrier.finish_barrier(pair.pk)
    assert as_carol.get("/v0/me/inbox/held").json()["items"] == []
    assert InboxItem.objects.get(token=held[0]["deliveryToken"]).state == InboxItem.State.REJECTED
