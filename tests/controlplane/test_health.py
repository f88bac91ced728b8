"""The probes and the backlog figures (controlplane.health): /healthz touches
nothing; /readyz asks the database and Redis, each within a bound, and
answers 503 naming what failed without saying where it lives; `manage.py
health` counts what an operator watches."""
from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import socket
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.test import Client

from controlplane import health
from controlplane.clock import freeze, now
from inbox.services import send_message
from tests.servers import ROOT, server_env
from webhooks.models import Delivery, Endpoint, Subscription

ADDRESS = "10.0.0.5"  # load balancers probe by address


@pytest.fixture(autouse=True)
def fresh_readiness(monkeypatch):
    """Each test's probes check again (a process answers from its last checks for a second)."""
    monkeypatch.setattr(health, "_last", None)


@contextlib.contextmanager
def refusing_port():
    """A loopback port bound by no listener: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@contextlib.contextmanager
def silent_port():
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_liveness_answers_without_the_database(settings):
    # given: no database access is allowed in this test; a host that is not the public one
    settings.ALLOWED_HOSTS = ["switchboard.example"]
    # when
    response = Client().get("/healthz", HTTP_HOST=ADDRESS)
    # then
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readiness_names_each_check_when_all_is_well(settings):
    # given
    settings.ALLOWED_HOSTS = ["switchboard.example"]
    # when
    response = Client().get("/readyz", HTTP_HOST=ADDRESS)
    # then
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    body = response.json()
    assert body["status"] == "ready" and body["checks"]["database"]["state"] == "ok"
    assert body["checks"]["redis"]["state"] == ("ok" if settings.REDIS_URL else "not configured")


@pytest.mark.django_db
def test_probes_within_a_second_share_one_check(monkeypatch):
    """Each /readyz took a database connection and a new Redis connection,
    uncounted: a flood of anonymous probes slowed a member's reads fourfold."""
    checks = []
    real = health.check_readiness
    monkeypatch.setattr(health, "check_readiness", lambda: checks.append(1) or real())
    answers = {Client().get("/readyz").status_code for _ in range(20)}
    assert answers == {200} and len(checks) == 1
    monkeypatch.setattr(health, "ANSWER_FOR_SECONDS", 0.0)
    Client().get("/readyz")
    assert len(checks) == 2


@pytest.mark.django_db
def test_an_unreachable_redis_is_503_naming_redis_and_nothing_of_its_address(settings):
    with refusing_port() as port:
        # given
        settings.REDIS_URL = f"redis://:hunter2@127.0.0.1:{port}/0"
        # when
        response = Client().get("/readyz")
    # then
    assert response.status_code == 503
    body = response.json()
    assert body == {"status": "unavailable", "checks": {"database": body["checks"]["database"],
                                                        "redis": {"state": "failed", "error": "ConnectionError"}}}
    assert body["checks"]["database"]["state"] == "ok"
    assert "hunter2" not in response.content.decode() and str(port) not in response.content.decode()


@pytest.mark.django_db
def test_a_redis_that_never_answers_fails_the_probe_within_its_bound(settings, monkeypatch):
    monkeypatch.setattr(health, "CHECK_SECONDS", 0.5)
    with silent_port() as port:
        settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
        started = time.monotonic()
        response = Client().get("/readyz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503 and response.json()["checks"]["redis"]["state"] in ("timeout", "failed")
    assert elapsed < 2.0


def test_an_unreachable_database_is_503_naming_the_database():
    # given: a server process whose database is a PostgreSQL port nobody listens on
    probe = ("import json, os, sys, time; from django.test import Client; started = time.monotonic(); "
             "r = Client().get('/readyz'); "
             "print(json.dumps({'status': r.status_code, 'body': r.json(), 'seconds': time.monotonic() - started})); "
             "sys.stdout.flush(); os._exit(0)")  # not waiting out the pool's own 10 s connection timeout
    with refusing_port() as port:
        env = server_env(DATABASE_URL=f"postgres://postgres:hunter2@127.0.0.1:{port}/test")
        env.pop("REDIS_URL", None)
        # when
        result = subprocess.run([sys.executable, "manage.py", "shell", "-c", probe], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
    # then: 503 within the bound, naming the database, not its address or password
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == 503 and answer["body"]["status"] == "unavailable"
    assert answer["body"]["checks"]["database"]["state"] in ("timeout", "failed")
    assert answer["seconds"] < health.CHECK_SECONDS + 1.5
    assert "hunter2" not in result.stdout and str(port) not in json.dumps(answer["body"])


@pytest.mark.django_db
def test_in_production_the_probes_answer_by_address_over_plain_http():
    probe = ("from django.test import Client; c = Client(); "
             f"print(c.get('/healthz', HTTP_HOST='{ADDRESS}').status_code, "
             f"c.get('/readyz', HTTP_HOST='{ADDRESS}').status_code, "
             f"c.get('/v0/spaces', HTTP_HOST='{ADDRESS}').status_code, "
             "c.get('/v0/spaces', HTTP_HOST='switchboard.example').status_code)")
    env = server_env(DEBUG="0", SWITCHBOARD_PUBLIC_URL="https://switchboard.example", TRUST_PROXY_HEADERS="1")
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", probe], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # the probes answer; the API refuses the address and redirects plain HTTP to HTTPS
    assert result.stdout.split("\n")[-2] == "200 200 400 301"


@pytest.mark.django_db
def test_the_health_command_counts_due_wakes_stuck_claims_suspensions_and_pending_items(space, general, alice,
                                                                                       bob, carol):
    # given: alice's active subscription to the space (no debounce) and a suspended one
    endpoint = Endpoint.objects.create(owner=alice, url="https://receiver.example/hook")
    active = Subscription.objects.create(owner=alice, endpoint=endpoint, kind=Subscription.Kind.SPACE, space=space,
                                         status=Subscription.Status.ACTIVE, debounce_ms=0, activation_position=0)
    Subscription.objects.create(owner=alice, endpoint=endpoint, kind=Subscription.Kind.SPACE, space=space,
                                status=Subscription.Status.SUSPENDED)
    # two sends mentioning bob and carol: one open wake, four pending items
    for body in ("@bob @carol build is red", "@bob @carol build is green"):
        send_message(general, body=body, actor=alice)
    # a wake a worker claimed and never recorded, of another subscription
    stuck = Subscription.objects.create(owner=bob, endpoint=endpoint, kind=Subscription.Kind.SPACE, space=space,
                                        status=Subscription.Status.ACTIVE, activation_position=0)
    Delivery.objects.create(subscription=stuck, after_position=0, through_position=1, state=Delivery.State.SENDING,
                            due_at=now(), claimed_until=now() - dt.timedelta(seconds=5))
    due_at = Delivery.objects.get(subscription=active).due_at
    # when: half a minute later
    out = io.StringIO()
    with freeze(due_at + dt.timedelta(seconds=30)):
        call_command("health", "--json", stdout=out)
        lines = io.StringIO()
        call_command("health", stdout=lines)
    # then
    figures = json.loads(out.getvalue())
    assert isinstance(figures.pop("tasks_queued"), int)
    assert figures == {"inbox_items_pending": 4, "inbox_items_unclassified": 0, "wakes_due": 1,
                       "oldest_due_wake_seconds": 30.0, "wakes_sending_past_lease": 1, "subscriptions_suspended": 1}
    printed = dict(line.split() for line in lines.getvalue().splitlines())
    assert list(printed) == ["tasks_queued", *figures] and printed["oldest_due_wake_seconds"] == "30.0"


def test_the_health_command_says_unknown_when_the_database_is_away(tmp_path):
    """It ended in a traceback (exit 1, nothing printed) when the figures mattered most."""
    away = f"sqlite:///{tmp_path}/no-such-folder/db.sqlite3"
    result = subprocess.run([sys.executable, "manage.py", "health", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=server_env(DATABASE_URL=away))
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures.keys() > {"inbox_items_pending", "wakes_due", "subscriptions_suspended"}
    assert all(value is None for name, value in figures.items() if name != "tasks_queued")
    assert "the inbox figures are unknown: OperationalError" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.django_db
def test_a_wake_behind_an_unfinished_one_of_its_subscription_is_not_counted_as_due(space, alice):
    # given: a wake waiting for its retry, and the next one due behind it
    endpoint = Endpoint.objects.create(owner=alice, url="https://receiver.example/hook")
    subscription = Subscription.objects.create(owner=alice, endpoint=endpoint, kind=Subscription.Kind.SPACE,
                                               space=space, status=Subscription.Status.ACTIVE, activation_position=0)
    Delivery.objects.create(subscription=subscription, after_position=0, through_position=1,
                            state=Delivery.State.PENDING, due_at=now() + dt.timedelta(minutes=5))
    Delivery.objects.create(subscription=subscription, after_position=1, through_position=2, due_at=now())
    # when / then: nothing a worker could send now
    figures = health.gauges()
    assert figures["wakes_due"] == 0 and figures["oldest_due_wake_seconds"] == 0.0


@pytest.mark.django_db
def test_a_wake_of_a_subscription_past_its_lease_is_not_counted_as_due(space, alice):
    # given: two due wakes, one of a subscription whose lease has run out (as an MCP push's may)
    endpoint = Endpoint.objects.create(owner=alice, url="https://receiver.example/hook")
    for lease_expires_at in (now() + dt.timedelta(hours=1), now() - dt.timedelta(seconds=1)):
        subscription = Subscription.objects.create(owner=alice, endpoint=endpoint, kind=Subscription.Kind.SPACE,
                                                   space=space, status=Subscription.Status.ACTIVE,
                                                   activation_position=0, lease_expires_at=lease_expires_at)
        Delivery.objects.create(subscription=subscription, after_position=0, through_position=1, due_at=now())
    # when / then: only the one a worker may send
    assert health.gauges()["wakes_due"] == 1
