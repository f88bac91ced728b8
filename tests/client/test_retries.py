"""A send whose answer is lost is retried with the same Idempotency-Key, and
the server keeps one message: through a real TCP proxy that drops the
first answer after the server has done the work."""
from urllib.parse import urlsplit

import pytest
from switchboard_client import Client, RetryPolicy, errors
from switchboard_client.routes import ROUTES, Route

from tests.client.proxy import LossyProxy

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_send_whose_answer_was_lost_is_retried_with_its_key_and_makes_one_message(clients, server):
    alice, bob = clients
    direct = bob.open_direct("lab", "alice").id
    address = urlsplit(server)
    proxy = LossyProxy((address.hostname, address.port), drop_answers=1)
    waits = []
    through_proxy = Client(proxy.base_url, bob.transport.token, sleep=waits.append)  # the retry goes at once
    # when: the first answer is lost on its way back
    sent = through_proxy.send("lab", direct, "exactly once")
    # then: two requests went out, both with the same key
    keys = proxy.idempotency_keys()
    assert len(keys) == 2 and keys[0] == keys[1] and len(waits) == 1
    # and the server holds one message: the retry got the original back
    inbox = alice.read_inbox().items
    assert [(e.item["postId"], e.item["content"]) for e in inbox] == [(sent.id, "exactly once")]
    events = [e for e in alice.space_events("lab", limit=100) if e.kind == "message.created"]
    assert [e.data["message"]["id"] for e in events] == [sent.id]
    proxy.close()


def test_a_revocation_whose_answer_was_lost_is_retried_with_its_key(clients, server):
    # given: a grant; every POST takes a key (SPEC §2), revoking one too
    alice, _ = clients
    alice.create_grant("lab", "grt_everyone", "project")
    address = urlsplit(server)
    proxy = LossyProxy((address.hostname, address.port), drop_answers=1)
    through_proxy = Client(proxy.base_url, alice.transport.token, sleep=lambda seconds: None)
    # when
    revoked = through_proxy.revoke_grant("grt_everyone")
    # then: sent twice under one key, and answered
    keys = proxy.idempotency_keys()
    assert len(keys) == 2 and keys[0] == keys[1]
    assert revoked.status == "revoked"
    proxy.close()


def test_a_write_without_a_key_is_not_retried_after_a_lost_answer(clients, server, monkeypatch):
    # given: a route the client knows takes no key, so it cannot know whether a repeat would act twice
    alice, _ = clients
    keyed = ROUTES["revoke_grant"]
    monkeypatch.setitem(ROUTES, "revoke_grant", Route(keyed.method, keyed.path, idempotent=False))
    address = urlsplit(server)
    proxy = LossyProxy((address.hostname, address.port), drop_answers=1)
    through_proxy = Client(proxy.base_url, alice.transport.token, retry=RetryPolicy(attempts=5),
                           sleep=lambda seconds: None)
    # when
    with pytest.raises(errors.ConnectionFailed) as lost:
        through_proxy.revoke_grant("grt_nothing-here")
    # then: one request only, and the error says it was sent
    assert len(proxy.requests) == 1 and lost.value.details["sent"] is True
    assert lost.value.status is None and isinstance(lost.value, errors.ServerError)
    proxy.close()


@pytest.mark.parametrize("hint", [-1, float("nan")])
def test_a_retry_after_hint_below_zero_or_not_a_number_is_no_wait_to_follow(hint):
    # given: a server answering 503 with a retry_after hint no wait can follow (and no header)
    from tests.client.test_signing_keys import Answering

    server = Answering(503, {}, {"error": {"code": "UNAVAILABLE", "message": "restarting",
                                           "details": {"retry_after": hint}}})
    slept = []
    client = Client(server.base_url, "sbt_" + "x" * 43, sleep=slept.append, retry=RetryPolicy(attempts=3))
    # when
    with pytest.raises(errors.SwitchboardError) as raised:
        client.me()
    server.close()
    # then: the client's own error after its retries, each wait a time.sleep takes (below zero: none;
    # not a number: its own backoff)
    assert raised.value.status == 503 and server.requests == 3 and len(slept) == 2
    assert all(0 <= wait <= RetryPolicy().max_backoff for wait in slept)


def test_a_delete_whose_answer_was_lost_is_done_not_a_404(clients, server):
    # given: a credential of alice's, and a proxy that loses the first answer (the delete is done)
    alice, _ = clients
    spare = alice.create_credential("spare")
    address = urlsplit(server)
    proxy = LossyProxy((address.hostname, address.port), drop_answers=1)
    through_proxy = Client(proxy.base_url, alice.transport.token, sleep=lambda seconds: None)
    # when: the retry finds nothing to delete
    assert through_proxy.delete_credential(spare.id) is None
    proxy.close()
    # then: that is the first attempt's doing, not an error; and an id never there is still a 404
    assert len(proxy.requests) == 2 and spare.id not in [c.id for c in alice.credentials().items]
    with pytest.raises(errors.NotFoundError):
        alice.delete_credential(spare.id)


def test_a_credential_whose_answer_was_lost_says_so_and_names_it(clients, server):
    # given: the answer carrying the new token is lost; the retry's replay carries none (the server keeps none)
    alice, _ = clients
    address = urlsplit(server)
    proxy = LossyProxy((address.hostname, address.port), drop_answers=1)
    through_proxy = Client(proxy.base_url, alice.transport.token, sleep=lambda seconds: None)
    # when
    with pytest.raises(errors.ConflictError) as lost:
        through_proxy.create_credential("ci")
    proxy.close()
    # then: not a credential without a token, but an error naming the one to delete
    made = [c.id for c in alice.credentials().items]
    assert lost.value.code == "TOKEN_LOST" and lost.value.details["credential"] in made
    assert len(proxy.idempotency_keys()) == 2


@pytest.mark.parametrize(("status", "headers", "body", "code"), [
    (200, {"Content-Type": "text/html"}, b"<html>sign in</html>", "BAD_RESPONSE"),
    (200, {}, {"unexpected": "shape"}, "BAD_RESPONSE"),
    (301, {"Location": "https://switchboard.example/v0/me"}, b"", "REDIRECTED"),
])
def test_an_answer_that_is_not_switchboards_is_an_error_of_its_own_not_retried(status, headers, body, code):
    from tests.client.test_signing_keys import Answering

    server = Answering(status, headers, body)
    client = Client(server.base_url, "sbt_" + "x" * 43, sleep=lambda seconds: None, retry=RetryPolicy(attempts=3))
    with pytest.raises(errors.SwitchboardError) as raised:
        client.me()
    server.close()
    assert raised.value.code == code and raised.value.status == status and server.requests == 1
    if status == 301:
        assert "https://switchboard.example/v0/me" in str(raised.value)


def test_a_call_that_expects_no_answer_still_refuses_a_foreign_one():
    # a proxy's sign-in page is not a revoked credential
    from tests.client.test_signing_keys import Answering

    server = Answering(200, {"Content-Type": "text/html"}, b"<html>sign in</html>")
    client = Client(server.base_url, "sbt_" + "x" * 43, retry=RetryPolicy(attempts=1))
    with pytest.raises(errors.ServerError) as raised:
        client.delete_credential("crd_aaaaaaaaaaaaaaaa")
    server.close()
    assert raised.value.code == "BAD_RESPONSE"
