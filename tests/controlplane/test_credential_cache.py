"""The bearer lookups a process remembers (with Redis): one Redis round
trip and no query while nothing changed, and a suspension or a revocation
holding everywhere from the moment it commits."""
import secrets

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane import bearer, services
from controlplane.api import authentication
from controlplane.cache import raw_redis
from controlplane.models import Member
from tests.conftest import Api

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the epoch lives in the shared cache")


@pytest.fixture(autouse=True)
def nothing_remembered():
    authentication._remembered.clear()
    yield
    authentication._remembered.clear()


def credential_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if "token_hash" in q["sql"]]


def set_epoch_elsewhere() -> bytes:
    """What another process's commit of a change does (its on_commit hook)."""
    client, key = raw_redis(authentication.EPOCH)
    epoch = secrets.token_hex(8).encode()
    client.set(key, epoch)
    return epoch


def test_a_remembered_credential_costs_no_query_and_one_redis_round_trip(as_alice, monkeypatch):
    import redis

    # given: alice's credential used once
    assert as_alice.get("/v0/me").status_code == 200
    sent = []  # every command and pipeline sent to Redis
    command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute
    monkeypatch.setattr(redis.Redis, "execute_command", lambda r, *a, **kw: sent.append(a[0]) or command(r, *a, **kw))
    monkeypatch.setattr(redis.client.Pipeline, "execute", lambda p, *a, **kw: sent.append(
        [c[0][0] for c in p.command_stack]) or execute(p, *a, **kw))
    # when
    with CaptureQueriesContext(connection) as queries:
        response = as_alice.get("/v0/me")
    # then: no lookup in the database; the rate limit counted it and read the epoch in one pipeline
    assert response.status_code == 200 and response.json()["member"]["handle"] == "@alice"
    assert credential_reads(queries.captured_queries) == []
    assert sent == [["SET", "INCRBY", "GET"]]


def test_a_change_committed_by_another_process_is_seen_on_the_next_request(as_alice, alice):
    # given: alice's credential remembered, then alice suspended behind this process's back
    assert as_alice.get("/v0/me").status_code == 200
    Member.objects.filter(pk=alice.pk).update(status=Member.Status.SUSPENDED)  # no signal here
    assert as_alice.get("/v0/me").status_code == 200  # remembered: nothing said the epoch moved
    # when: the process that suspended her commits and moves the epoch
    set_epoch_elsewhere()
    # then
    assert as_alice.get("/v0/me").status_code == 401


def test_a_remembered_lookup_expires(as_alice, alice, monkeypatch):
    import time

    # given
    assert as_alice.get("/v0/me").status_code == 200
    Member.objects.filter(pk=alice.pk).update(status=Member.Status.SUSPENDED)
    # when: CREDENTIAL_CACHE_SECONDS later
    monkeypatch.setattr(authentication, "_clock", lambda: time.monotonic() + settings.CREDENTIAL_CACHE_SECONDS)
    # then
    assert as_alice.get("/v0/me").status_code == 401


@pytest.mark.parametrize("change", ["suspend", "demote", "revoke"])
def test_the_services_changes_move_the_epoch_when_they_commit(make_member, api_for, change,
                                                              django_capture_on_commit_callbacks):
    # given: an admin's credential remembered by this process
    root = make_member("root", is_admin=True)
    api = api_for(root)
    assert api.get("/v0/approval-requests").status_code == 200
    client, key = raw_redis(authentication.EPOCH)
    before = client.get(key)
    # when
    with django_capture_on_commit_callbacks(execute=True) as hooks:
        if change == "suspend":
            services.update_member(root, status=Member.Status.SUSPENDED, actor=None)
        elif change == "demote":
            services.update_member(root, is_admin=False, actor=None)
        else:
            bearer.revoke_credential(root.credentials.get(), actor=None)
    # then: the epoch moved at the commit, and this process forgot at once
    assert hooks and client.get(key) != before
    assert authentication._remembered == {}
    assert api.get("/v0/approval-requests").status_code == (403 if change == "demote" else 401)


def test_new_members_and_credentials_leave_the_epoch_alone(alice, django_capture_on_commit_callbacks):
    # given
    client, key = raw_redis(authentication.EPOCH)
    epoch = set_epoch_elsewhere()
    # when
    with django_capture_on_commit_callbacks(execute=True):
        bearer.issue_credential(alice, actor=None)
        services.create_member("dora", actor=None)
    # then
    assert client.get(key) == epoch


def test_unknown_tokens_are_not_remembered(db):
    # given
    api = Api()
    api.client.credentials(HTTP_AUTHORIZATION="Bearer sbt_" + "A" * 43)
    # when
    statuses = [api.get("/v0/me").status_code for _ in range(3)]
    # then
    assert statuses == [401] * 3
    assert authentication._remembered == {}
