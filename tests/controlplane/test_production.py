"""Production settings (DEBUG off): hosts, TLS, proxies, and what refuses to start."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from django.test import Client, RequestFactory

from controlplane.ratelimit import client_address
from tests.servers import ROOT, server_env, serving

PRODUCTION = {"DEBUG": "0", "SWITCHBOARD_PUBLIC_URL": "https://switchboard.example", "TRUST_PROXY_HEADERS": "1"}


def manage(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=server_env(**env),
                          capture_output=True, text=True, timeout=60)


def test_the_deployment_check_finds_nothing_to_report():
    result = manage("check", "--deploy", **PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout + result.stderr


@pytest.mark.parametrize("setting,told", [
    ({"RATE_LIMIT_PER_MINUTE": "abc"}, "RATE_LIMIT_PER_MINUTE must be a whole number, not 'abc'."),
    ({"EVENT_RETENTION_DAYS": "-1"}, "EVENT_RETENTION_DAYS must be at least 0, not -1."),
    ({"SYNC_THREADS": "--5"}, "SYNC_THREADS must be a whole number, not '--5'."),
    ({"SYNC_THREADS": "0"}, "SYNC_THREADS must be at least 1, not 0."),
    ({"FEED_RECHECK_SECONDS": "0"}, "FEED_RECHECK_SECONDS must be at least 0.05 seconds, not 0."),
    ({"DATABASE_URL": "foo://x"}, "DATABASE_URL is postgres://user@host:5432/name or sqlite:///path, not that: "
                                  "its scheme is unknown."),
    ({"DATABASE_URL": "mysql://user:hunter2@db/switchboard"},
     "DATABASE_URL is postgres://user@host:5432/name or sqlite:///path, not that: only PostgreSQL and SQLite are "
     "supported."),
    ({"REDIS_URL": "http://user:hunter2@cache"}, "REDIS_URL is redis://, rediss:// or unix:// (redis://host:6379/0), "
                                                 "not 'cache'."),
    ({"LOG_LEVEL": "loud"}, "LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'."),
    ({"Q_LOG_LEVEL": "loud"}, "Q_LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'."),
    # each was taken silently: on SQLite, without an https:// URL, or as "no"
    ({"DB_POOL_MAX": "0"}, "DB_POOL_MAX must be at least 1, not 0."),
    ({"DB_PREPARE_THRESHOLD": "abc"}, "DB_PREPARE_THRESHOLD must be a whole number, not 'abc'."),
    ({"SECURE_HSTS_SECONDS": "abc"}, "SECURE_HSTS_SECONDS must be a whole number, not 'abc'."),
    ({"TRUST_PROXY_HEADERS": "y"}, "TRUST_PROXY_HEADERS is 1 or 0 (true/false, yes/no, on/off), not 'y'."),
    ({"WEBHOOK_CA_BUNDLE": "/nonexistent/ca.pem"}, "WEBHOOK_CA_BUNDLE names no file: '/nonexistent/ca.pem'."),
    # past year 1 from today: taken, and then every hourly prune (or claim sweep) failed, for good
    ({"EVENT_RETENTION_DAYS": "1000000"}, "EVENT_RETENTION_DAYS must be at most 36500, not 1000000."),
    ({"CLAIM_TTL_HOURS": "99999999"}, "CLAIM_TTL_HOURS must be at most 876000, not 99999999."),
    # a wait that never ends: the look at the log head that finds a lost wake never came
    ({"FEED_RECHECK_SECONDS": "inf"}, "FEED_RECHECK_SECONDS must be finite, not inf."),
    ({"FEED_RECHECK_SECONDS": "1e300"}, "FEED_RECHECK_SECONDS must be at most 3600.0 seconds, not 1e+300."),
    # below the largest message, a sender's largest could never be delivered (at 0, none)
    ({"MAILBOX_SENDER_SHARE": "0"}, "MAILBOX_SENDER_SHARE must be at least 65536, not 0."),
    # refused by `serve` alone, where the rest are refused by every command
    ({"SERVE_HEALTHCHECK_SECONDS": "2"}, "SERVE_HEALTHCHECK_SECONDS must be 0 (no health check) or at least 3, not 2."),
    ({"SERVE_SERVER": "gunicorn"}, "SERVE_SERVER is uvicorn, granian or daphne, not 'gunicorn'."),
])
def test_a_setting_that_cannot_be_stops_with_one_line_naming_it(setting, told):
    result = manage("check", **setting)
    assert result.returncode == 1 and result.stderr == f"manage.py: {told}\n"  # no traceback, no password


def test_debug_logging_is_switchboards_own_and_the_task_queue_takes_its_own_level():
    """Libraries log whole answers at DEBUG: with LOG_LEVEL=DEBUG every chunk
    of an MCP answer (delivery tokens, message bodies) went to the log.
    Q_LOG_LEVEL did nothing: django-q2 sets it only where no logger has a handler."""
    names = ["sse_starlette.sse", "mcp.server.streamable_http", "switchboard.send", "webhooks.engine", "django-q"]
    result = manage("shell", "-c", "import logging; print(*(logging.getLogger(name).getEffectiveLevel() "
                    f"for name in {names!r}))", LOG_LEVEL="debug", Q_LOG_LEVEL="error")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "20 20 10 10 40"


def test_the_deployment_check_warns_of_a_host_check_turned_off():
    result = manage("check", "--deploy", **PRODUCTION, ALLOWED_HOSTS="switchboard.example, *")
    assert "(switchboard.W001) ALLOWED_HOSTS accepts any host." in result.stdout + result.stderr


def test_https_means_secure_cookies_hsts_and_the_public_host_only():
    result = manage("shell", "-c", "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
                    "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_SSL_REDIRECT, s.ALLOWED_HOSTS)",
                    **PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "True True 31536000 True ['switchboard.example']"


def test_an_https_public_url_without_its_proxys_headers_refuses_to_start():
    # serve speaks plain HTTP: unaware of the proxy's TLS, it redirected every request to itself
    result = manage("check", **{**PRODUCTION, "TRUST_PROXY_HEADERS": "0"})
    assert result.returncode != 0 and "set TRUST_PROXY_HEADERS=1" in result.stderr
    behind = manage("shell", "-c", "from django.test import Client; print(Client().get('/v0/spaces', "
                    "HTTP_HOST='switchboard.example', HTTP_X_FORWARDED_PROTO='https').status_code)", **PRODUCTION)
    assert behind.returncode == 0 and behind.stdout.split("\n")[-2] == "401"


def test_the_host_list_may_have_spaces_after_its_commas():
    result = manage("shell", "-c", "from django.conf import settings; print(settings.ALLOWED_HOSTS)",
                    **PRODUCTION, ALLOWED_HOSTS="a.example, b.example ,")
    assert result.returncode == 0 and result.stdout.split("\n")[-2] == "['a.example', 'b.example']"


@pytest.mark.django_db(transaction=True)
def test_the_server_takes_no_forwarded_address_unless_told_to_trust_it():
    # every request from loopback, as a local proxy's would be: its X-Forwarded-For is the client's own word
    bad = {"Authorization": "Bearer sbt_" + "A" * 43}
    with serving("--no-worker", RATE_LIMIT_PER_MINUTE="3") as (base, _):
        spoofed = [httpx.get(f"{base}/v0/spaces", headers={**bad, "X-Forwarded-For": f"198.51.100.{n}"}).status_code
                   for n in range(6)]
    assert spoofed[:3] == [401] * 3 and 429 in spoofed[3:]


def test_private_network_webhooks_refuse_to_start_in_production():
    result = manage("check", **PRODUCTION, WEBHOOK_ALLOW_PRIVATE_NETWORKS="1")
    assert result.returncode != 0
    assert "WEBHOOK_ALLOW_PRIVATE_NETWORKS is for development and tests only" in result.stderr


@pytest.mark.django_db
def test_a_request_naming_another_host_is_400_except_the_health_check(settings):
    settings.ALLOWED_HOSTS = ["switchboard.example"]
    client = Client()
    assert client.get("/v0/spaces", HTTP_HOST="switchboard.example").status_code == 401  # reached the API
    wrong = client.get("/v0/spaces", HTTP_HOST="evil.example")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "INVALID_REQUEST"
    assert client.get("/healthz", HTTP_HOST="10.0.0.5").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("host", ["evil.example", "dev_box", "127.0.0.1:abc", "[::1"])
def test_a_host_that_is_not_served_is_400_in_the_contracts_shape_with_debug_too(settings, debug, host):
    """With DEBUG (`make run`'s default), Django's own answer to a malformed
    host was its debug page: every setting, DATABASE_URL's password included."""
    settings.DEBUG, settings.ALLOWED_HOSTS = debug, ["switchboard.example"]
    wrong = Client().get("/v0/spaces", HTTP_HOST=host)
    assert (wrong.status_code, wrong["Content-Type"]) == (400, "application/json")
    assert wrong.json()["error"] == {"code": "INVALID_REQUEST", "message": "This host is not served here.",
                                     "details": {"reason": "host"}}


def test_a_debug_page_hides_the_connection_urls(settings, rf):
    from django.views.debug import technical_500_response

    secret = "-password-1"  # (the page shows this file's lines too: the whole value is never written here)
    settings.DEBUG, settings.DATABASE_URL = True, f"postgres://someone:db{secret}@db.example/switchboard"
    settings.REDIS_URL = f"redis://:redis{secret}@cache.example:6379/0"
    try:
        raise ValueError("a page failed")
    except ValueError:
        page = technical_500_response(rf.get("/app/"), *sys.exc_info()).content.decode()
    assert "a page failed" in page and "DATABASE_URL" in page
    assert f"db{secret}" not in page and f"redis{secret}" not in page


@pytest.mark.parametrize("trust, expected", [(False, "10.0.0.9"), (True, "203.0.113.7")])
def test_client_addresses_come_from_the_proxy_only_when_trusted(settings, trust, expected):
    settings.TRUST_PROXY_HEADERS = trust
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.7")
    assert client_address(request) == expected


@pytest.mark.parametrize("bind", ["127.0.0.1:70000", "127.0.0.1:-1", "127.0.0.1:abc", "127.0.0.1:\u0661\u0662", "nohost"])
def test_a_bind_address_past_the_port_range_is_one_line_naming_it(bind):
    # (a port over 65535 ended in an OverflowError's traceback)
    from django.core.management import CommandError

    from controlplane.management.commands.serve import split_bind

    with pytest.raises(CommandError, match="--bind must be HOST:PORT"):
        split_bind(bind)
    assert split_bind("[::1]:65535") == ("::1", 65535)
