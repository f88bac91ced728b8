"""SPEC §2: error shape, authentication, idempotency keys, rate limits, schema."""
import pytest
from django.conf import settings

from controlplane.models import Credential, Member, Space
from controlplane.tokens import hash_token
from tests.conftest import Api, clear_of_window_edge, error_code
from tests.servers import cut_every_database_connection


def test_healthz(anon):
    response = anon.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_unknown_route_is_json_404(anon):
    response = anon.get("/v0/nope")
    assert response.status_code == 404
    assert error_code(response) == "NOT_FOUND"


@pytest.mark.parametrize("path", ["/v0/me", "/v0/spaces/lab/events", "/app/login/", "/v0/nope"])
def test_too_many_query_parameters_are_a_400_in_the_contracts_shape_with_debug_on_too(db, settings, path):
    """Read first by the long-poll view or a web page, too many fields were
    a 500 with DEBUG on (`make run`): Django's debug page read them again."""
    from django.test import Client

    settings.DEBUG = True
    query = "&".join(f"k{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    response = Client(raise_request_exception=False).get(path, QUERY_STRING=query)
    assert (response.status_code, error_code(response)) == (400, "INVALID_REQUEST")


def test_unknown_routes_count_against_the_callers_address(settings, anon, space):
    """No budget saw them: a caller could ask for routes that are not there without end."""
    settings.RATE_LIMIT_PER_MINUTE = 3
    clear_of_window_edge()
    statuses = [anon.get(path).status_code for path in ("/v0/nope", "/v0/spaces/lab", "/nowhere", "/v0/nope")]
    assert statuses == [404, 200, 404, 429]


def test_api_answers_are_kept_by_no_cache(as_alice, space):
    # a new credential's token, delivery tokens and bodies came with no Cache-Control at all
    answers = [as_alice.post("/v0/me/credentials", {"name": "laptop"}), as_alice.get("/v0/me/inbox"),
               as_alice.get("/v0/me/inbox/events", wait_ms=0), as_alice.get("/v0/spaces/lab/events", wait_ms=0),
               as_alice.get("/v0/no-such-route")]
    assert [a["Cache-Control"] for a in answers] == ["no-store"] * 5


def test_wrong_method_is_json_405(as_alice):
    response = as_alice.delete("/v0/me")
    assert response.status_code == 405
    assert error_code(response) == "METHOD_NOT_ALLOWED"


def test_missing_credential_is_401(anon):
    response = anon.get("/v0/me")
    assert response.status_code == 401
    assert error_code(response) == "UNAUTHENTICATED"
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="switchboard"'  # RFC 9110: every 401


@pytest.mark.parametrize("header", ["Bearer sbt_" + "A" * 43, "Bearer nope", "Basic abc", "Bearer"])
def test_bad_credential_is_401(db, header):
    api = Api()
    api.client.credentials(HTTP_AUTHORIZATION=header)
    response = api.get("/v0/me")
    assert response.status_code == 401
    assert error_code(response) == "UNAUTHENTICATED"
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="switchboard"'


def test_suspended_member_cannot_authenticate(as_alice, alice):
    # given
    Member.objects.filter(pk=alice.pk).update(status="suspended")
    # when
    response = as_alice.get("/v0/me")
    # then
    assert response.status_code == 401


def test_credentials_are_stored_as_hashes(as_alice, alice):
    # when
    response = as_alice.post("/v0/me/credentials")
    # then
    assert response.status_code == 201
    token = response.json()["token"]
    assert token.startswith("sbt_") and len(token) == 47
    stored = Credential.objects.get(public_id=response.json()["id"])
    assert stored.token_hash == hash_token(token)
    assert token not in str(Credential.objects.filter(member=alice).values())
    assert Api(alice, token).get("/v0/me").json()["member"]["handle"] == "@alice"
    listed = as_alice.get("/v0/me/credentials").json()["credentials"]
    assert all("token" not in c for c in listed) and len(listed) == 2


def test_deleted_credential_stops_working(api_for, alice):
    # given
    api = api_for(alice)
    created = api.post("/v0/me/credentials").json()
    other = Api(alice, created["token"])
    # when
    response = api.delete(f"/v0/me/credentials/{created['id']}")
    # then
    assert response.status_code == 204
    assert other.get("/v0/me").status_code == 401
    assert api.delete(f"/v0/me/credentials/{created['id']}").status_code == 404


@pytest.mark.parametrize("body", [
    {"slug": "ok", "name": "x", "extra": 1},
    {"slug": 5, "name": "x"},
    {"slug": "ok", "name": ["x"]},
    {"slug": "ok", "name": "x", "visibility": "secret"},
    {"slug": "Not A Slug", "name": "x"},
    {"name": "x"},
])
def test_invalid_fields_are_400_and_change_nothing(as_alice, body):
    response = as_alice.post("/v0/spaces", body)
    assert response.status_code == 400
    assert error_code(response) == "INVALID_REQUEST"
    assert not Space.objects.exists()


def test_refused_credentials_count_against_their_address_as_anonymous_reads_do(settings, anon, api_for, space,
                                                                               alice):
    # given
    settings.RATE_LIMIT_PER_MINUTE = 3
    clear_of_window_edge()
    guessing = Api(token="sbt_" + "x" * 43)
    # when: no credential, a guessed one, an anonymous read, then a guess again
    statuses = [anon.get("/v0/me").status_code, guessing.get("/v0/me").status_code,
                anon.get("/v0/spaces/lab").status_code, guessing.get("/v0/me").status_code]
    # then: one budget for the address; past it, 429 with Retry-After
    assert statuses == [401, 401, 200, 429]
    limited = anon.get("/v0/me")
    assert error_code(limited) == "RATE_LIMITED" and 1 <= int(limited["Retry-After"]) <= 60
    # a member's own budget is theirs alone
    assert api_for(alice).get("/v0/me").status_code == 200


def test_an_ipv6_host_is_one_budget_whichever_address_of_its_64_it_takes(settings, anon, space):
    # given a budget of 3, and a host taking a new address of its /64 for every request
    settings.RATE_LIMIT_PER_MINUTE = 3
    clear_of_window_edge()
    addresses = iter(f"2001:db8:1:2::{n:x}" for n in range(1, 100))
    # when it reads anonymously, then guesses credentials
    reads = [anon.client.get("/v0/spaces/lab", REMOTE_ADDR=next(addresses)).status_code for _ in range(4)]
    guesses = [anon.client.get("/v0/me", REMOTE_ADDR=next(addresses), HTTP_AUTHORIZATION="Bearer sbt_" + "x" * 43)
               .status_code for _ in range(2)]
    # then it is counted once, as sign-in counts it; another /64 has a budget of its own
    assert reads == [200, 200, 200, 429] and guesses == [429, 429]
    assert anon.client.get("/v0/spaces/lab", REMOTE_ADDR="2001:db8:1:3::1").status_code == 200


def test_rate_limit_is_per_member(settings, api_for, alice, bob):
    # given
    settings.RATE_LIMIT_PER_MINUTE = 3
    as_alice, as_bob = api_for(alice), api_for(bob)
    clear_of_window_edge()
    # when
    statuses = [as_alice.get("/v0/me").status_code for _ in range(4)]
    # then
    assert statuses == [200, 200, 200, 429]
    limited = as_alice.get("/v0/me")
    assert error_code(limited) == "RATE_LIMITED"
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert as_bob.get("/v0/me").status_code == 200
    # and a second credential of alice's shares her limit
    assert api_for(alice).get("/v0/me").status_code == 429


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the shared deployment's cache")
def test_counting_a_request_against_the_limit_is_one_redis_round_trip(monkeypatch):
    import redis

    from controlplane.ratelimit import hit

    # given: every command and pipeline sent to Redis, recorded
    sent = []
    command, pipeline = redis.Redis.execute_command, redis.client.Pipeline.execute
    monkeypatch.setattr(redis.Redis, "execute_command", lambda r, *args, **kw: sent.append(args[0]) or command(
        r, *args, **kw))
    monkeypatch.setattr(redis.client.Pipeline, "execute", lambda p, *args, **kw: sent.append(
        [c[0][0] for c in p.command_stack]) or pipeline(p, *args, **kw))
    clear_of_window_edge()
    # when
    verdicts = [hit("round-trips", limit=2, window=60) for _ in range(3)]
    # then: counted, and one pipeline each (the slot made with its expiry if new, then counted)
    assert verdicts[:2] == [None, None] and 0 < verdicts[2] <= 60
    assert sent == [["SET", "INCRBY"]] * 3


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the shared deployment's cache")
def test_the_redis_cache_keeps_one_client_per_connection_pool():
    import redis

    from django.core.cache import cache

    # given: the cache's client, as every cache operation and rate limit asks for it
    client = cache._cache.get_client(write=True)
    built = []
    init = redis.Redis.__init__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.Redis, "__init__", lambda r, *a, **kw: built.append(r) or init(r, *a, **kw))
        # when: the limit counts a request, and the cache is used
        from controlplane.ratelimit import hit

        hit("one-client", limit=10, window=60)
        cache.set("one-client", 1)
        assert cache.get("one-client") == 1
    # then: no client was built for them, and the one kept is the same
    assert built == []
    assert cache._cache.get_client(write=True) is client
    assert client.connection_pool is cache._cache._get_connection_pool(True)


def test_redis_replies_are_parsed_by_hiredis():
    # Every counted request reads a pipeline's replies and every live frame
    # comes through the channel layer: with redis-py's pure-Python parser,
    # sends through `serve` were 6% slower (docs/benchmarks.md, round fifteen).
    from redis.asyncio.connection import DefaultParser as AsyncParser
    from redis.connection import DefaultParser

    assert DefaultParser.__name__ == "_HiredisParser"
    assert AsyncParser.__name__ == "_AsyncHiredisParser"


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the shared deployment's cache")
def test_every_request_context_shares_one_redis_client():
    import contextvars

    from django.core.cache import DEFAULT_CACHE_ALIAS, caches

    # given: two request contexts (under ASGI each request runs in its own)
    def backend_and_client():
        backend = caches[DEFAULT_CACHE_ALIAS]
        return backend, backend._cache.get_client(write=True)

    # when
    (first, client), (second, other) = (contextvars.Context().run(backend_and_client) for _ in range(2))
    # then: Django built a backend for each, and both count on one client and one pool
    assert first is not second
    assert client is other and client.connection_pool is other.connection_pool


def test_credential_creation_is_throttled_per_member(settings, as_alice, as_bob):
    # given
    settings.CREDENTIALS_PER_HOUR = 2
    clear_of_window_edge(3600)
    # when
    statuses = [as_alice.post("/v0/me/credentials", {}).status_code for _ in range(3)]
    # then
    assert statuses == [201, 201, 429]
    assert 1 <= int(as_alice.post("/v0/me/credentials", {})["Retry-After"]) <= 3600
    assert as_bob.post("/v0/me/credentials", {}).status_code == 201


def test_schema_lists_every_route_with_its_errors(anon):
    # given
    from django.urls import get_resolver

    # when
    schema = anon.client.get("/v0/schema/", HTTP_ACCEPT="application/json").json()
    # then
    paths = schema["paths"]
    expected = {
        "/v0/me": {"get"}, "/v0/me/credentials": {"get", "post"}, "/v0/me/credentials/{credential_id}": {"delete"},
        "/v0/members": {"post"}, "/v0/spaces": {"post"}, "/v0/spaces/{slug}": {"get"},
        "/v0/spaces/{slug}/join": {"post"}, "/v0/spaces/{slug}/members": {"get", "post"},
        "/v0/spaces/{slug}/members/{handle}": {"delete"}, "/v0/spaces/{slug}/conversations": {"get"},
        "/v0/spaces/{slug}/direct": {"post"}, "/v0/spaces/{slug}/channels": {"post"},
        "/v0/spaces/{slug}/groups": {"post"},
        "/v0/spaces/{slug}/conversations/{conversation}/messages": {"post"},
        "/v0/spaces/{slug}/events": {"get"}, "/v0/me/inbox/events": {"get"}, "/v0/me/snapshot": {"get"},
        "/v0/messages/{message_id}": {"get"}, "/v0/messages/{message_id}/body": {"get"},
        "/v0/messages/{message_id}/acknowledge": {"post"}, "/v0/messages/{message_id}/resolve": {"post"},
    }
    for path, methods in expected.items():
        assert set(paths[path]) >= methods, path
        for method in methods:
            responses = paths[path][method]["responses"]
            assert "429" in responses, (path, method)
            assert any(code.startswith("4") and code != "429" for code in responses), (path, method)
    send = paths["/v0/spaces/{slug}/conversations/{conversation}/messages"]["post"]["responses"]
    assert {"400", "403", "404", "409", "413", "422"} <= set(send)
    assert "BODY_TOO_LARGE" in send["413"]["description"]
    # every route lists what any route can answer: a bad credential (anonymous reads too), the rate limit, an
    # unreachable database
    for path, operations in paths.items():
        for method, operation in operations.items():
            assert {"401", "429", "503"} <= set(operation["responses"]), (method, path)
    # every write route lists what any body can be answered before its view looks at it, those that
    # declare none too (their empty body is parsed all the same)
    for path, operations in paths.items():
        for method, operation in operations.items():
            if method in ("post", "put", "patch", "delete"):
                listed = operation["responses"]
                for status, code in (("413", "BODY_TOO_LARGE"), ("415", "INVALID_REQUEST"), ("422", "INVALID_BODY")):
                    assert f"`{code}`" in listed.get(status, {}).get("description", ""), (method, path, status)
    assert "RESYNC_REQUIRED" in paths["/v0/me/inbox/events"]["get"]["responses"]["410"]["description"]
    assert {} in paths["/v0/spaces/{slug}/events"]["get"]["security"]
    assert {} not in paths["/v0/me/inbox/events"]["get"].get("security", [{"bearer": []}])
    assert "401" in paths["/v0/spaces/{slug}/events"]["get"]["responses"]
    # every operation has a name of its own, none the path's (a client generated from the schema names its methods so)
    ids = [operation["operationId"] for operations in paths.values() for operation in operations.values()]
    assert len(ids) == len(set(ids)) and not [i for i in ids if i.startswith(("spaces_", "me_", "v0_"))]
    assert {"claim_task", "release_task", "submit_task", "complete_task", "reopen_task"} <= set(ids)
    # every /v0/ route Django knows is in the schema
    routes = {str(p.pattern) for p in get_resolver().url_patterns}
    assert "v0/" in routes


def test_the_schema_is_built_once_per_process_whatever_asks_for_it(anon, monkeypatch):
    # given a process that has not built it yet, counting builds
    from drf_spectacular.generators import SchemaGenerator

    from controlplane.api.schema_view import BuiltOnce

    build, builds = SchemaGenerator.get_schema, []
    monkeypatch.setattr(SchemaGenerator, "get_schema", lambda self, **kw: builds.append(1) or build(self, **kw))
    monkeypatch.setattr(BuiltOnce, "built", {})
    # when anyone asks for it several times, in either format, naming versions the API does not have
    answers = [anon.client.get(f"/v0/schema/?version={version}", HTTP_ACCEPT=accept) for accept, version in
               (("application/json", "1"), ("application/vnd.oai.openapi", "2"), ("application/json", "1"))]
    # then each is the whole schema, built once (a build costs a fifth of a second of CPU)
    assert [a.status_code for a in answers] == [200, 200, 200] and answers[0].content == answers[2].content
    assert b"/v0/spaces" in answers[1].content and len(builds) == 1 and len(BuiltOnce.built) == 1
    assert answers[0].json()["info"]["version"] == "0"


def test_docs_ui_is_served_without_external_assets(anon):
    response = anon.client.get("/v0/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger" in html.lower()
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html


@pytest.mark.parametrize("method,path", [
    ("get", "/v0/spaces/%00"), ("get", "/v0/spaces/lab%00/events"), ("get", "/v0/messages/%00"),
    ("get", "/v0/messages/msg_%00/body"), ("delete", "/v0/me/credentials/%00"), ("post", "/v0/spaces/%00/join"),
    ("post", "/v0/spaces/lab/conversations/%23gen%00/messages"), ("get", "/v0/spaces/LAB"),
    ("get", "/v0/messages/msg_" + "z" * 300),
])
def test_impossible_path_segments_are_404(as_alice, method, path):
    response = getattr(as_alice, method)(path)
    assert response.status_code == 404
    assert error_code(response) == "NOT_FOUND"


def test_unknown_route_is_json_in_debug_mode_too(settings, anon):
    settings.DEBUG = True
    response = anon.get("/v0/nope")
    assert response.status_code == 404 and error_code(response) == "NOT_FOUND"


@pytest.mark.parametrize("path,body", [
    ("/v0/spaces", {"slug": "lab\n", "name": "x"}),
    ("/v0/me/credentials", {"unexpected": True}),
])
def test_trailing_newlines_and_stray_fields_change_nothing(as_alice, path, body):
    response = as_alice.post(path, body)
    assert response.status_code == 400
    assert not Space.objects.exists()


def test_handles_are_matched_whole(api_for, make_member):
    admin = api_for(make_member("root", is_admin=True))
    response = admin.post("/v0/members", {"handle": "dave\n"})
    assert response.status_code == 400
    assert not Member.objects.filter(handle__startswith="dave").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lost_database_is_503_with_retry_after(as_alice):
    # given: every connection this process holds to the database is cut (as a restart does)
    from django.db import connection

    cut_every_database_connection()
    # when
    response = as_alice.get("/v0/me")
    # then: retry soon, in the contract's shape (that the retry is served, through a
    # real server: tests/test_server.py)
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert error_code(response) == "UNAVAILABLE" and response.json()["error"]["details"] == {"retry_after": 1}
    connection.close()
    connection.close_pool()  # the pool's other cut connections would fail the test's own teardown


def test_a_lost_redis_is_503_with_retry_after(as_alice, lost_redis):
    # given: the cache on a Redis that refuses connections (lost_redis)
    # when
    response = as_alice.get("/v0/me")
    # then: the same answer as a lost database's, not a logged 500
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert error_code(response) == "UNAVAILABLE" and response.json()["error"]["details"] == {"retry_after": 1}


def test_a_credential_carries_its_owners_name(as_alice):
    created = as_alice.post("/v0/me/credentials", {"name": "laptop CLI"})
    unnamed = as_alice.post("/v0/me/credentials")
    too_long = as_alice.post("/v0/me/credentials", {"name": "x" * 101})
    assert created.status_code == 201 and created.json()["name"] == "laptop CLI"
    assert unnamed.json()["name"] == ""
    assert too_long.status_code == 400
    listed = {c["id"]: c["name"] for c in as_alice.get("/v0/me/credentials").json()["credentials"]}
    assert listed[created.json()["id"]] == "laptop CLI" and len(listed) == 3


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="prepared statements are PostgreSQL's")
@pytest.mark.django_db
def test_a_hot_statement_is_prepared_on_its_connection():
    # given: a live pass's readers query, run as often as the threshold asks
    from django.db import connection

    from controlplane.access import conversation_readers

    threshold = settings.DATABASES["default"]["OPTIONS"]["prepare_threshold"]
    space = Space.objects.create(slug="lab", name="Lab")
    conversation = space.conversations.create(kind="channel", name="general", address="lab/general")
    # when
    answers = [conversation_readers(conversation.pk, set()) for _ in range(threshold + 1)]
    # then: the same answer every time, and the statement is prepared on this connection
    assert answers == [(set(), space.send_policy)] * (threshold + 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for statement, in cursor.fetchall()]
    assert any("SELECT s.send_policy, m.id" in statement for statement in prepared), prepared


@pytest.mark.parametrize("year, shown", [(1, "0001-01-01T00:00:00.000Z"), (999, "0999-01-01T00:00:00.000Z"),
                                         (2027, "2027-01-01T00:00:00.000Z")])
def test_every_timestamp_is_rfc_3339_whatever_its_year(year, shown):
    # (a grant's expires_at of year 1 was refused with "1-01-01T00:00:00.000Z" in its details)
    import datetime as dt

    from controlplane.clock import rfc3339

    assert rfc3339(dt.datetime(year, 1, 1, tzinfo=dt.timezone.utc)) == shown
