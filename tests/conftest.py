"""Fixtures shared by the whole suite: members, authenticated API clients, spaces."""
from __future__ import annotations

import contextlib
import json as jsonlib
import time

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from controlplane import bearer, services
from controlplane.models import Member
from tests.shapes import check_response
from tests.webhooks.receiver import serve_receiver

ON_POSTGRES = settings.IS_POSTGRES


def pytest_collection_modifyitems(config, items):
    needs_pg = pytest.mark.skip(reason="needs PostgreSQL: run with DATABASE_URL=postgres://…")
    for item in items:
        if "postgres" in item.keywords and not ON_POSTGRES:
            item.add_marker(needs_pg)


@pytest.fixture(autouse=True)
def tasks_run_synchronously(monkeypatch):
    """django-q2 tasks run in-process in unit tests; the end-to-end tests run
    real clusters."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.fixture
def request_threads_busy(monkeypatch):
    """The process's request threads (controlplane.db.in_pool), all busy
    until the test ends: what still answers runs on the event loop."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from controlplane import db

    release, pool = threading.Event(), ThreadPoolExecutor(max_workers=1)
    pool.submit(release.wait)
    monkeypatch.setattr(db, "_pool", pool)
    yield
    release.set()
    pool.shutdown()


@contextlib.asynccontextmanager
async def under_the_server():
    """Reads from this task as under the ASGI server, which sets `pooled`
    for what it serves (controlplane.loop_reads: on PostgreSQL, the
    loop's own connection), closed at the end."""
    from controlplane.db import pooled
    from controlplane.loop_reads import loop_reads

    pooled.set(True)
    try:
        yield loop_reads
    finally:
        await loop_reads.close()


@pytest.fixture(autouse=True)
def no_loop_connection_left():
    """A test that served requests in-process through the ASGI application
    may leave its ended event loop's own database connection open
    (controlplane.loop_reads); closed after it, so that no test
    inherits it and the test database can be dropped."""
    from controlplane.loop_reads import loop_reads

    yield
    loop_reads.forget()


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """Each test gets its own channel layer object. A channels-redis receive
    left suspended when a test's event loop closed never runs its `finally`:
    its lock stays held and bound to that dead loop, and every later test
    on the same layer object would fail on it."""
    yield
    from channels.layers import channel_layers

    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """Each test starts with no rate-limit or verification marks, and no
    delivery timer's next run awaited (they live in the cache). On Redis
    only those keys go: the database also holds the channel layer and the
    task broker of servers the tests run."""
    from django.core.cache import cache

    client = getattr(getattr(cache, "_cache", None), "get_client", None)
    if client is None:
        cache.clear()
        return
    redis = client(write=True)
    for pattern in ("*:rl:*", "*:verify:*", "*:webhooks:timer-next"):
        keys = list(redis.scan_iter(match=pattern, count=1000))
        if keys:
            redis.delete(*keys)


class Api:
    """A JSON client for one caller (or anonymous)."""

    def __init__(self, member: Member | None = None, token: str | None = None):
        self.member = member
        self.client = APIClient()
        if token:
            self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def _call(self, method, path, json=None, headers=None, **params):
        headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
        if method == "get":
            response = self.client.get(path, params or None, **headers)
        else:
            # Encoded here (ASCII-escaped) so tests can send what a renderer would refuse, like lone surrogates.
            raw = b"" if json is None else jsonlib.dumps(json).encode()
            response = self.client.generic(method.upper(), path, raw, content_type="application/json", **headers)
        check_response(method, path, response)  # every answer has its published shape
        return response

    def get(self, path, **params):
        return self._call("get", path, **params)

    def post(self, path, json=None, headers=None):
        return self._call("post", path, json, headers)

    def patch(self, path, json=None, headers=None):
        return self._call("patch", path, json, headers)

    def put(self, path, json=None, headers=None):
        return self._call("put", path, json, headers)

    def delete(self, path, headers=None):
        return self._call("delete", path, None, headers)


def clear_of_window_edge(window: int = 60, margin: float = 2.0) -> None:
    """Sleep into the next fixed rate-limit window when this one ends within
    `margin` seconds, so that every request a test counts falls in one
    window (a limit's count starts again at each window's edge)."""
    left = window - time.time() % window
    if left < margin:
        time.sleep(left + 0.05)


def meeting_point(parties: int = 2, seconds: float = 3):
    """A call that returns once `parties` threads have made it, or after
    `seconds` (one may wait for a lock another holds: the meeting breaks,
    and each goes on), to hold concurrent requests at one step."""
    import threading

    barrier = threading.Barrier(parties)

    def meet() -> None:
        try:
            barrier.wait(seconds)
        except threading.BrokenBarrierError:
            pass

    return meet


def at_once(*calls, timeout: float = 30) -> list:
    """Run each call in a thread of its own, all started together, each on a
    database connection of its own (closed after); their results in order,
    once all have returned."""
    import threading

    from django.db import connections

    results = [None] * len(calls)

    def run(n: int) -> None:
        try:
            results[n] = calls[n]()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results


@pytest.fixture
def lost_redis(settings):
    """The cache (rate limits, remembered bearer lookups) on a Redis that
    refuses connections, as while it restarts."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings.RATE_LIMIT_PER_MINUTE = 1000
    settings.CACHES = {"default": {"BACKEND": "controlplane.cache.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{port}/0", "KEY_PREFIX": "lost"}}


def error_code(response) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    return body["error"]["code"]


@pytest.fixture
def make_member(db):
    def make(handle: str, **kwargs) -> Member:
        return services.create_member(handle, actor=None, **kwargs)

    return make


@pytest.fixture
def api_for(db):
    def make(member: Member) -> Api:
        _, token = bearer.issue_credential(member, actor=None)
        return Api(member, token)

    return make


@pytest.fixture
def anon():
    return Api()


@pytest.fixture
def alice(make_member):
    return make_member("alice")


@pytest.fixture
def bob(make_member):
    return make_member("bob")


@pytest.fixture
def carol(make_member):
    return make_member("carol")


@pytest.fixture
def as_alice(api_for, alice):
    return api_for(alice)


@pytest.fixture
def as_bob(api_for, bob):
    return api_for(bob)


@pytest.fixture
def as_carol(api_for, carol):
    return api_for(carol)


@pytest.fixture
def space(alice, bob, carol):
    """An open space owned by alice, with bob and carol as members."""
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    return space


@pytest.fixture
def general(space, alice):
    return services.create_channel(space, "general", actor=alice)


@pytest.fixture(scope="session")
def https_receiver(tmp_path_factory):
    receiver, ca, stop = serve_receiver(tmp_path_factory.mktemp("tls"))
    yield receiver, ca
    stop()


@pytest.fixture
def receiver(https_receiver, settings):
    """The HTTPS receiver on 127.0.0.1, trusted through WEBHOOK_CA_BUNDLE;
    loopback targets allowed (tests only)."""
    receiver, ca = https_receiver
    settings.WEBHOOK_CA_BUNDLE = str(ca)
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    receiver.requests.clear()
    receiver.respond = None
    yield receiver
    receiver.respond = None


def someone_waits_for_a_lock(timeout: float = 10.0) -> bool:
    """Whether a connection to the test database waits for a lock within
    `timeout` (PostgreSQL): a concurrent writer under test has reached it."""
    import time

    from django.db import connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False
