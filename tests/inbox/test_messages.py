"""SPEC §4: sending, limits, idempotency, mentions, recipients, privacy, handling."""
import pytest

from controlplane import services
from controlplane.models import Event, EventAddressee
from inbox.models import Message, Recipient
from tests.conftest import error_code


def send(api, body, conversation="%23general", headers=None, **extra):
    return api.post(f"/v0/spaces/lab/conversations/{conversation}/messages", {"body": body, **extra}, headers=headers)


def test_send_to_channel_renders_the_contract_shape(general, as_alice):
    # when
    response = send(as_alice, "hello *world*")
    # then
    assert response.status_code == 201
    message = response.json()["message"]
    assert set(message) == {"id", "conversation", "space", "author", "body", "reply_to", "related_paths",
                            "mentions", "created_at", "position"}
    assert message["id"].startswith("msg_") and message["conversation"] == general.public_id
    assert message["author"] == "@alice" and message["space"] == "lab" and message["mentions"] == []
    assert message["created_at"].endswith("Z") and len(message["created_at"]) == 24


def test_one_send_writes_one_event_recipient_and_addressee(general, as_alice):
    # given
    before = Event.objects.order_by("-position").values_list("position", flat=True).first()
    # when
    message = send(as_alice, "hi @bob").json()["message"]
    # then
    (event,) = Event.objects.filter(position__gt=before)
    assert event.kind == "message.created" and event.position == message["position"]
    assert event.data["message"] == message
    assert list(Recipient.objects.filter(message__public_id=message["id"]).values_list("member__handle", "position")) \
        == [("bob", message["position"])]
    assert list(EventAddressee.objects.filter(event=event).values_list("member__handle", flat=True)) == ["bob"]


@pytest.mark.parametrize("body", ["exact  spacing \r\n\ttabs ", "e\u0301 combining", "emoji \U0001F600",
                                  "  leading", "x" * 8192, "\u00e9" * 4096])
def test_body_is_stored_exactly(general, as_alice, body):
    response = send(as_alice, body)
    assert response.status_code == 201
    assert response.json()["message"]["body"] == body
    assert Message.objects.get(public_id=response.json()["message"]["id"]).body == body


@pytest.mark.parametrize("body,status,code", [
    ("x" * 8193, 413, "BODY_TOO_LARGE"),
    ("\u00e9" * 4097, 413, "BODY_TOO_LARGE"),
    ("", 422, "INVALID_BODY"),
    ("nul\u0000", 422, "INVALID_BODY"),
    ("lone \ud83d surrogate", 422, "INVALID_BODY"),
    (42, 400, "INVALID_REQUEST"),
    (None, 400, "INVALID_REQUEST"),
])
def test_bad_bodies_change_nothing(general, as_alice, body, status, code):
    before = Event.objects.count()
    response = send(as_alice, body)
    assert response.status_code == status
    assert error_code(response) == code
    assert not Message.objects.exists() and Event.objects.count() == before


def test_invalid_utf8_bytes_are_invalid_body(general, as_alice):
    raw = b'{"body": "caf\xc3"}'
    response = as_alice.client.generic("POST", "/v0/spaces/lab/conversations/%23general/messages", raw,
                                       content_type="application/json")
    assert response.status_code == 422 and error_code(response) == "INVALID_BODY"


def test_request_over_upload_limit_is_413(general, as_alice):
    response = send(as_alice, "x" * 300_000)
    assert response.status_code == 413 and error_code(response) == "BODY_TOO_LARGE"


@pytest.mark.parametrize("extra", [{"unknown": 1}, {"related_paths": "a"}, {"related_paths": [1]},
                                   {"reply_to": "msg_nothere"}, {"related_paths": ["x" * 1025]}])
def test_bad_fields_are_400(general, as_alice, extra):
    response = send(as_alice, "hi", **extra)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Message.objects.exists()


def test_a_message_addresses_at_most_as_many_members_as_the_largest_group(general, as_alice, make_member):
    # given 65 members of the host, none of them in the open space, so each can read it
    from inbox.services import MAX_RECIPIENTS

    handles = [make_member(f"reader{n:02d}").handle for n in range(MAX_RECIPIENTS + 1)]
    # when a channel message mentions all of them, then as many as a group holds
    everyone = send(as_alice, " ".join(f"@{h}" for h in handles))
    as_many = send(as_alice, " ".join(f"@{h}" for h in handles[:MAX_RECIPIENTS]))
    # then the first is refused and changes nothing; the second reaches each of them
    assert everyone.status_code == 409 and error_code(everyone) == "LIMIT_EXCEEDED"
    assert everyone.json()["error"]["details"] == {"max_recipients": 64}
    assert as_many.status_code == 201 and len(as_many.json()["message"]["mentions"]) == MAX_RECIPIENTS
    assert Message.objects.count() == 1 and Recipient.objects.count() == MAX_RECIPIENTS


def test_idempotent_send(general, space, as_alice, as_bob, alice):
    # given
    key = {"Idempotency-Key": "send-0001"}
    first = send(as_alice, "once", headers=key, related_paths=["a.py"])
    # when
    retry = send(as_alice, "once", headers=key, related_paths=["a.py"])
    changed = send(as_alice, "twice", headers=key, related_paths=["a.py"])
    other_paths = send(as_alice, "once", headers=key, related_paths=["b.py"])
    services.create_channel(space, "other", actor=alice)
    other_conversation = send(as_alice, "once", "%23other", headers=key, related_paths=["a.py"])
    other_sender = send(as_bob, "once", headers=key, related_paths=["a.py"])
    # then
    assert first.status_code == 201
    assert retry.status_code == 200 and retry.json() == first.json()
    for conflict in (changed, other_paths, other_conversation):
        assert conflict.status_code == 409 and error_code(conflict) == "IDEMPOTENCY_CONFLICT"
    assert other_sender.status_code == 201
    assert Message.objects.count() == 2


def test_mentions_notify_only_real_readable_members(general, as_alice, make_member, as_bob):
    # given: dave exists but is not in the (open) space; erin is in no space and the space is open
    make_member("dave")
    body = ("hi @bob and @Carol, not `@bob` nor [@carol](https://x.example) nor https://x.example/@dave "
            "nor carol@example.com nor @nobody; but @dave\n\n```\n@alice\n```")
    # when
    message = send(as_alice, body).json()["message"]
    # then
    assert message["mentions"] == ["@bob", "@carol", "@dave"]
    recipients = set(Recipient.objects.filter(message__public_id=message["id"]).values_list("member__handle",
                                                                                             flat=True))
    assert recipients == {"bob", "carol", "dave"}


def test_mention_never_reaches_into_private_space(alice, bob, make_member, api_for):
    # given
    space = services.create_space(slug="lab", name="Lab", visibility="private", send_policy="open", actor=alice)
    services.create_channel(space, "general", actor=alice)
    # when
    message = send(api_for(alice), "ping @bob").json()["message"]
    # then
    assert message["mentions"] == []
    assert not Recipient.objects.exists()
    assert api_for(bob).get(f"/v0/messages/{message['id']}").status_code == 404


def test_author_is_never_a_recipient(general, as_alice):
    message = send(as_alice, "note to self @alice").json()["message"]
    assert not Recipient.objects.filter(message__public_id=message["id"]).exists()


def test_direct_and_group_recipients(space, as_alice, alice, bob, carol):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    group, _ = services.get_or_create_group(space, [carol, alice, bob], actor=alice)
    # when
    to_bob = send(as_alice, "just us", direct.public_id).json()["message"]
    to_group = send(as_alice, "all of us, esp. @carol", group.public_id).json()["message"]
    # then
    assert list(Recipient.objects.filter(message__public_id=to_bob["id"]).values_list("member__handle", flat=True)) \
        == ["bob"]
    assert list(Recipient.objects.filter(message__public_id=to_group["id"]).order_by("id")
                .values_list("member__handle", flat=True)) == ["carol", "bob"]
    assert to_group["mentions"] == ["@carol"]
    assert set(EventAddressee.objects.values_list("member__handle", flat=True)) == {"bob", "carol"}


def test_removed_member_stops_receiving(space, as_alice, alice, bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    services.remove_member(space, bob, actor=alice)
    message = send(as_alice, "still there?", direct.public_id).json()["message"]
    assert not Recipient.objects.filter(message__public_id=message["id"]).exists()


def test_a_member_removed_from_an_open_space_is_not_notified_by_its_channels(general, space, as_alice, alice, bob,
                                                                            make_member):
    services.remove_member(space, bob, actor=alice)
    make_member("dan")  # never joined: reads the open space, so a mention notifies him
    message = send(as_alice, "@bob @dan see this").json()["message"]
    assert message["mentions"] == ["@dan"]
    assert list(Recipient.objects.filter(message__public_id=message["id"]).values_list("member__handle", flat=True)) \
        == ["dan"]
    services.join_space(space, actor=bob)  # back in: mentions reach him again
    assert send(as_alice, "@bob welcome back").json()["message"]["mentions"] == ["@bob"]


def test_third_member_learns_nothing_by_id(space, as_alice, as_carol, anon, alice, bob):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    message_id = send(as_alice, "secret", direct.public_id).json()["message"]["id"]
    # then
    for api in (as_carol,):
        for path in (f"/v0/messages/{message_id}", f"/v0/messages/{message_id}/body"):
            response = api.get(path)
            assert response.status_code == 404 and error_code(response) == "NOT_FOUND"
        assert api.post(f"/v0/messages/{message_id}/acknowledge").status_code == 404
        assert api.post(f"/v0/messages/{message_id}/resolve", {"result": "x"}).status_code == 404
        assert api.get("/v0/messages/msg_doesnotexist").json() == api.get(f"/v0/messages/{message_id}").json()
        assert send(api, "intrude", direct.public_id).status_code == 404
    assert anon.get(f"/v0/messages/{message_id}").status_code == 401


def test_non_members_and_observers_cannot_send(general, make_member, api_for, as_alice):
    outsider = api_for(make_member("outsider"))
    assert send(outsider, "hi").status_code == 403
    as_alice.post("/v0/spaces/lab/members", {"member": "@outsider", "role": "observer"})
    assert send(outsider, "hi").status_code == 403
    assert not Message.objects.exists()


def test_archived_space_takes_no_sends(general, space, as_alice):
    space.archived = True
    space.save()
    response = send(as_alice, "hello?")
    assert response.status_code == 409 and error_code(response) == "CONFLICT"


def test_explicit_only_space_needs_grants(alice, bob, api_for):
    # given
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    # when
    response = send(api_for(alice), "may I?", direct.public_id)
    # then
    assert response.status_code == 403 and error_code(response) == "GRANT_REQUIRED"
    assert response.json()["error"]["details"]["recipients"] == ["@bob"]
    assert not Message.objects.exists()


def test_reply_to_must_be_in_the_same_conversation(space, general, as_alice, alice):
    services.create_channel(space, "other", actor=alice)
    parent = send(as_alice, "parent").json()["message"]["id"]
    assert send(as_alice, "child", reply_to=parent).json()["message"]["reply_to"] == parent
    assert send(as_alice, "stray", "%23other", reply_to=parent).status_code == 400


def test_status_shows_recipients_without_body(general, as_alice, as_bob):
    message_id = send(as_alice, "hi @bob").json()["message"]["id"]
    status = as_bob.get(f"/v0/messages/{message_id}").json()["message"]
    assert "body" not in status and status["body_bytes"] == 7
    assert status["recipients"] == [{"member": "@bob", "state": "pending", "acknowledged_at": None,
                                     "resolved_at": None, "result": None,
                                     "rejected_at": None, "reason": None}]


def test_body_pages_never_split_a_scalar(general, as_alice, as_bob):
    # given: 3-byte and 4-byte scalars
    body = ("\u20ac\U0001F600a" * 300)[:700]
    message_id = send(as_alice, body).json()["message"]["id"]
    # when
    pieces, cursor = [], None
    while True:
        params = {"max_bytes": 5} | ({"cursor": cursor} if cursor else {})
        page = as_bob.get(f"/v0/messages/{message_id}/body", **params).json()
        assert 0 < len(page["body"].encode()) <= 5
        pieces.append(page["body"])
        cursor = page["cursor"]
        if not page["has_more"]:
            break
    # then
    assert "".join(pieces) == body
    assert page["total_bytes"] == len(body.encode())


def test_body_cursor_is_bound_to_caller_and_message(general, as_alice, as_bob, as_carol):
    first = send(as_alice, "a" * 100).json()["message"]["id"]
    second = send(as_alice, "b" * 100).json()["message"]["id"]
    cursor = as_bob.get(f"/v0/messages/{first}/body", max_bytes=10).json()["cursor"]
    assert error_code(as_carol.get(f"/v0/messages/{first}/body", cursor=cursor)) == "INVALID_CURSOR"
    assert error_code(as_bob.get(f"/v0/messages/{second}/body", cursor=cursor)) == "INVALID_CURSOR"
    assert as_bob.get(f"/v0/messages/{first}/body", max_bytes=3).status_code == 400


def test_acknowledge_and_resolve(general, as_alice, as_bob):
    # given
    message_id = send(as_alice, "please review @bob").json()["message"]["id"]
    before = Event.objects.count()
    # when
    acked = as_bob.post(f"/v0/messages/{message_id}/acknowledge")
    acked_again = as_bob.post(f"/v0/messages/{message_id}/acknowledge")
    # then: acknowledging does not resolve, and is recorded once
    assert acked.status_code == 200 and acked_again.status_code == 200
    assert acked.json()["message"]["recipients"][0]["state"] == "acknowledged"
    assert list(Event.objects.filter(position__gt=before).values_list("kind", flat=True)) == ["message.acknowledged"]
    # when
    missing = as_bob.post(f"/v0/messages/{message_id}/resolve", {})
    too_big = as_bob.post(f"/v0/messages/{message_id}/resolve", {"result": "x" * 2049})
    resolved = as_bob.post(f"/v0/messages/{message_id}/resolve", {"result": "LGTM"})
    same = as_bob.post(f"/v0/messages/{message_id}/resolve", {"result": "LGTM"})
    different = as_bob.post(f"/v0/messages/{message_id}/resolve", {"result": "nope"})
    by_author = as_alice.post(f"/v0/messages/{message_id}/resolve", {"result": "x"})
    # then
    assert missing.status_code == 400 and too_big.status_code == 400
    assert resolved.json()["message"]["recipients"][0] | {"resolved_at": None} == {
        "member": "@bob", "state": "resolved", "acknowledged_at": acked.json()["message"]["recipients"][0][
            "acknowledged_at"], "resolved_at": None, "result": "LGTM", "rejected_at": None, "reason": None}
    assert same.status_code == 200
    assert different.status_code == 409
    assert by_author.status_code == 403 and error_code(by_author) == "FORBIDDEN"
    assert Event.objects.filter(kind="message.resolved").count() == 1


def test_malformed_send_key_is_400_and_stores_nothing(general, as_alice):
    response = send(as_alice, "hi", headers={"Idempotency-Key": "short"})
    assert response.status_code == 400 and error_code(response) == "INVALID_IDEMPOTENCY_KEY"
    assert not Message.objects.exists()


def test_anonymous_cannot_send(general, anon):
    response = send(anon, "hi")
    assert response.status_code == 401 and error_code(response) == "UNAUTHENTICATED"


def test_retry_returns_the_original_even_after_the_right_to_send_is_gone(general, as_bob, alice, bob, space):
    # given: bob sends with a key, then becomes an observer
    key = {"Idempotency-Key": "send-before-demotion"}
    first = send(as_bob, "sent while allowed", headers=key)
    services.add_member(space, bob, role="observer", actor=alice)
    # when
    retry = send(as_bob, "sent while allowed", headers=key)
    fresh = send(as_bob, "new message", headers={"Idempotency-Key": "after-demotion"})
    # then
    assert first.status_code == 201
    assert retry.status_code == 200 and retry.json() == first.json()
    assert fresh.status_code == 403


@pytest.mark.parametrize("ref", ["#general", "id"])
def test_retry_returns_the_original_after_its_sender_left_a_private_space(alice, bob, api_for, ref):
    # given: bob sent with a key into a private space, and was removed from it since
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="open", actor=alice)
    services.add_member(vault, bob, actor=alice)
    channel = services.create_channel(vault, "general", actor=alice)
    as_bob, key = api_for(bob), {"Idempotency-Key": "sent-before-removal"}
    path = f"/v0/spaces/vault/conversations/{'%23general' if ref == '#general' else channel.public_id}/messages"
    first = as_bob.post(path, {"body": "hi"}, headers=key)
    services.remove_member(vault, bob, actor=alice)
    # when: the same request again, and others under the same key
    retry = as_bob.post(path, {"body": "hi"}, headers=key)
    changed = as_bob.post(path, {"body": "changed"}, headers=key)
    elsewhere = as_bob.post("/v0/spaces/vault/conversations/%23other/messages", {"body": "hi"}, headers=key)
    # then: the original for the same request; for anything else the 404 of a space he cannot read
    assert first.status_code == 201 and retry.status_code == 200 and retry.json() == first.json()
    assert changed.status_code == 409 and error_code(changed) == "IDEMPOTENCY_CONFLICT"
    assert elsewhere.status_code == 404
    assert as_bob.post(path, {"body": "hi"}, headers={"Idempotency-Key": "another-key"}).status_code == 404
    assert Message.objects.filter(space=vault).count() == 1


@pytest.mark.parametrize("raw", [b"{not json", b"[1]", b'{"unknown": 1}'])
def test_acknowledge_refuses_a_malformed_body(general, as_alice, as_bob, raw):
    message_id = send(as_alice, "hi @bob").json()["message"]["id"]
    response = as_bob.client.generic("POST", f"/v0/messages/{message_id}/acknowledge", raw,
                                     content_type="application/json")
    assert response.status_code == 400
    assert Recipient.objects.get(message__public_id=message_id).state == "pending"


def test_unicode_email_addresses_do_not_mention(general, as_alice):
    message = send(as_alice, "write to josé@bob.com please").json()["message"]
    assert message["mentions"] == []


@pytest.mark.parametrize("body", ["thanks @bobé!", "@bob日本 there", "@bobß", "@bob\u0301 hi"])
def test_a_handle_followed_by_a_letter_of_any_script_names_no_shorter_member(general, as_alice, bob, body):
    # when: what follows @bob makes it another word (a letter, or a mark that changes its last letter)
    message = send(as_alice, body).json()["message"]
    # then: bob is not mentioned, and nothing reached his inbox
    assert message["mentions"] == []
    assert not Recipient.objects.filter(member=bob).exists()


def test_a_handle_ends_at_punctuation_of_any_script(general, as_alice, bob):
    message = send(as_alice, "ask @bob。 or @bob, then @bob's").json()["message"]
    assert message["mentions"] == ["@bob"]
