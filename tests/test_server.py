"""End to end through real `serve` processes: HTTP on loopback, the real
database, the real channel layer (Redis when REDIS_URL is set)."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection

from controlplane.management.commands.serve import default_workers
from controlplane.processes import descendants, in_session, kill_all
from tests.inbox.test_firewall import inbox_paths
from tests.servers import (ROOT, cut_every_database_connection, left_behind, manage, member_token, read_until,
                           server_env, serving, start_serving)

pytestmark = pytest.mark.django_db(transaction=True)


def group_leaders_below(process) -> list[int]:
    return [pid for pid in descendants(process.pid) if os.getpgid(pid) == pid]


def server_processes_by_default() -> int:
    return settings.SERVE_WORKERS or default_workers()


def wait_until(done, failure: str, seconds: float = 5) -> None:
    """Until `done()`, failing with `failure` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)


def member_with_token(handle: str) -> dict:
    return {"Authorization": f"Bearer {member_token(handle)}"}


def test_serve_answers_and_stops_cleanly_on_ctrl_c():
    # given
    with serving() as (base, process):
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        # the server processes and the django-q2 cluster, each leading its own process group
        assert len(group_leaders_below(process)) == server_processes_by_default() + 1
        # serve announces its address once its own readiness check passes,
        # which may come a moment after the test's
        assert f"serving at {base}/" in read_until(process, "serving at")[-1]
        # when
        process.send_signal(signal.SIGINT)
        # then
        assert process.wait(30) == 0
    assert left_behind(process) == []


@pytest.mark.parametrize("delay", [0.2, 0.8, 1.5, 2.5])
def test_ctrl_c_at_any_moment_of_start_up_leaves_nothing_running(delay):
    # given: serve interrupted while its children are still starting (the
    # cluster may be importing Django, forking its sentinel or its workers)
    process = start_serving()
    try:
        time.sleep(delay)
        # when
        process.send_signal(signal.SIGINT)
        # then: it exits, and the output pipe closes because nobody holds it.
        # 0 once serve listens; before that Python itself ends the process: by
        # SIGINT, or with status 1 when the KeyboardInterrupt lands inside an
        # import that wraps it (Python 3.11 wraps it in __set_name__), or 0
        # when Python drops it there and serve sees it was interrupted.
        assert process.wait(30) in (0, 1, -signal.SIGINT)
        process.stdout.read()
        assert left_behind(process) == []
    finally:  # a serve left running would take later tests' deliveries
        kill_all(lambda: in_session(process.pid))


def test_a_killed_serve_takes_its_children_down():
    # given
    with serving() as (base, process):
        assert len(group_leaders_below(process)) == server_processes_by_default() + 1
        # when: serve itself dies without a chance to stop anything
        process.kill()
        process.wait()
        # then: its children are told (SIGTERM) and stop theirs in turn
        assert left_behind(process) == []


def test_long_poll_on_one_node_wakes_for_a_send_on_another(settings):
    # given: two server processes sharing the database. With Redis the wake
    # must cross nodes through the channel layer (the periodic recheck is
    # pushed past the poll's wait); without it, the recheck finds the event.
    alice, bob = member_with_token("alice"), member_with_token("bob")
    recheck = {"FEED_RECHECK_SECONDS": 60} if settings.REDIS_URL else {}
    with serving("--no-worker", **recheck) as (node_a, _), serving("--no-worker", **recheck) as (node_b, _):
        assert httpx.post(f"{node_a}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice).status_code == 201
        assert httpx.post(f"{node_b}/v0/spaces/lab/join", headers=bob).status_code == 201
        assert httpx.post(f"{node_a}/v0/spaces/lab/channels", json={"name": "general"},
                          headers=alice).status_code == 201
        cursor = httpx.get(f"{node_b}/v0/me/inbox/events", headers=bob).json()["cursor"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            poll = pool.submit(httpx.get, f"{node_b}/v0/me/inbox/events",
                               params={"cursor": cursor, "wait_ms": 20_000}, headers=bob, timeout=30)
            # when
            sent = httpx.post(f"{node_a}/v0/spaces/lab/conversations/%23general/messages",
                              json={"body": "hey @bob"}, headers=alice)
            # then
            assert sent.status_code == 201
            events = poll.result(timeout=30).json()["events"]
    assert [e["data"]["message"]["body"] for e in events] == ["hey @bob"]


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the rate limit's counters")
def test_requests_share_the_servers_redis_connections(settings):
    import redis

    # given: a server counting every request against its member's rate limit
    headers = member_with_token("alice")
    server = redis.Redis.from_url(settings.REDIS_URL)
    with serving("--no-worker", RATE_LIMIT_PER_MINUTE=1_000_000) as (base, _), httpx.Client() as client:
        assert client.get(f"{base}/v0/me", headers=headers).status_code == 200
        opened = server.info("stats")["total_connections_received"]
        # when
        statuses = {client.get(f"{base}/v0/me", headers=headers).status_code for _ in range(100)}
        # then: counted on the connections the server already had (Django
        # builds a cache backend per request context: one pool per request
        # opened a connection each time)
        assert statuses == {200}
        assert server.info("stats")["total_connections_received"] - opened < 10


def test_a_revocation_or_a_suspension_holds_on_every_node_once_it_answers():
    # given: alice's two credentials, each used on two server processes (with
    # Redis, each process remembers the lookups it made)
    from controlplane import services
    from controlplane.models import Member

    first = member_with_token("alice")
    with serving("--no-worker") as (node_a, _), serving("--no-worker") as (node_b, _):
        created = httpx.post(f"{node_a}/v0/me/credentials", headers=first).json()
        second = {"Authorization": f"Bearer {created['token']}"}
        for node in (node_a, node_b, node_a, node_b):
            assert [httpx.get(f"{node}/v0/me", headers=h).status_code for h in (first, second)] == [200, 200]
        # when: the second credential is revoked through one node
        assert httpx.delete(f"{node_a}/v0/me/credentials/{created['id']}", headers=first).status_code == 204
        # then: from its answer on, neither node takes it; the first still works
        assert [httpx.get(f"{node}/v0/me", headers=second).status_code for node in (node_b, node_a)] == [401, 401]
        assert [httpx.get(f"{node}/v0/me", headers=first).status_code for node in (node_b, node_a)] == [200, 200]
        # when: alice is suspended (what the admin site does), in this process
        services.update_member(Member.objects.get(handle="alice"), status=Member.Status.SUSPENDED, actor=None)
        # then
        assert [httpx.get(f"{node}/v0/me", headers=first).status_code for node in (node_b, node_a)] == [401, 401]


@pytest.mark.postgres
def test_waiting_long_polls_hold_no_database_connection():
    # given: a pool of 2 connections and 12 long-polls waiting at once
    alice = member_with_token("alice")
    with serving("--no-worker", DB_POOL_MIN=1, DB_POOL_MAX=2) as (base, _):
        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
        httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=alice)
        cursor = httpx.get(f"{base}/v0/spaces/lab/events", headers=alice).json()["cursor"]
        while True:
            page = httpx.get(f"{base}/v0/spaces/lab/events", params={"cursor": cursor}, headers=alice).json()
            cursor = page["cursor"]
            if not page["has_more"]:
                break
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            polls = [pool.submit(httpx.get, f"{base}/v0/spaces/lab/events",
                                 params={"cursor": cursor, "wait_ms": 25_000}, headers=alice, timeout=40)
                     for _ in range(12)]
            # when: a send needs a connection while they all wait
            sent = httpx.post(f"{base}/v0/spaces/lab/conversations/%23general/messages",
                              json={"body": "still room"}, headers=alice, timeout=20)
            # then
            assert sent.status_code == 201
            bodies = [[e["data"]["message"]["body"] for e in p.result(timeout=40).json()["events"]] for p in polls]
    assert bodies == [["still room"]] * 12


@pytest.mark.postgres
def test_a_lost_database_costs_only_retried_requests_and_nothing_stored_twice():
    # given: a serving node whose database connections are all cut (a restart, a failover)
    alice = member_with_token("alice")
    with serving("--no-worker") as (base, _):
        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
        httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=alice)
        cut_every_database_connection()
        connection.close()
        connection.close_pool()  # this process's own were cut too
        # when: a client sends, retrying 503s with its key as Retry-After says
        answers = retried_on_503(lambda: httpx.post(
            f"{base}/v0/spaces/lab/conversations/%23general/messages", json={"body": "once"},
            headers={**alice, "Idempotency-Key": "after-cut-1"}))
        # then: 503s only until the pools (one per server process) have dropped their
        # broken connections, then the send, stored once
        assert {a.status_code for a in answers[:-1]} <= {503} and answers[-1].status_code == 201
        read = retried_on_503(lambda: httpx.get(f"{base}/v0/spaces/lab/events", headers=alice))
        events = read[-1].json()["events"]
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.created"] == ["once"]


def retried_on_503(request, tries: int = 10) -> list[httpx.Response]:
    """Every answer of `request`, repeated after each 503 as its Retry-After says."""
    answers = [request()]
    while answers[-1].status_code == 503 and len(answers) < tries:
        time.sleep(int(answers[-1].headers["Retry-After"]))
        answers.append(request())
    return answers


def test_management_commands_print_only_their_result():
    # when
    member_id = manage("createmember", "dana", "--kind", "human", "--password-stdin", input="s3cret-pass\n")
    token = manage("issuecredential", "@dana")
    first_admin = manage("bootstrap", SWITCHBOARD_BIND="0.0.0.0:8698")
    second = manage("bootstrap")
    # then
    assert member_id.strip().startswith("mem_") and member_id.count("\n") <= 1
    assert token.strip().startswith("sbt_") and token.count("\n") <= 1
    assert "password:" in first_admin and second == ""
    # its links name where serve listens (they said port 8000 whatever the bind)
    assert "http://127.0.0.1:8698/app/" in first_admin
    from django.contrib.auth import authenticate
    assert authenticate(username="dana", password="s3cret-pass") is not None


def test_bootstrap_refuses_a_bad_or_taken_handle_in_one_line():
    """Both ended in a traceback."""
    manage("createmember", "admin")  # a member who is no admin holds the default handle
    for args, told in ((["--handle", "Bad Handle"], "A handle is"), ([], "That handle is taken")):
        result = subprocess.run([sys.executable, "manage.py", "bootstrap", *args], cwd=ROOT, env=server_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and told in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_inbox_items_and_tokens_survive_a_restart():
    # given: an item delivered through one server process
    alice, bob = member_with_token("alice"), member_with_token("bob")
    with serving("--no-worker") as (base, _):
        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
        httpx.post(f"{base}/v0/spaces/lab/join", headers=bob)
        direct = httpx.post(f"{base}/v0/spaces/lab/direct", json={"member": "@bob"},
                            headers=alice).json()["conversation"]["id"]
        httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": "survive"}, headers=alice)
        before = httpx.get(f"{base}/v0/me/inbox", headers=bob).json()["items"]
    # when: a new process serves the same database
    with serving("--no-worker") as (base, _):
        after = httpx.get(f"{base}/v0/me/inbox", headers=bob).json()["items"]
        token = after[0]["deliveryToken"]
        event = httpx.get(f"{base}/v0/inbox-events/evt_{token[4:]}", headers=bob).json()
    # then
    assert before == after and len(after) == 1
    assert event == {"item": after[0]["item"]}


def test_a_real_worker_classifies_firewalled_items_and_every_read_path_agrees():
    # given: the server and its django-q2 cluster; bob's firewall holds secrets and admits alice otherwise
    alice, bob = member_with_token("alice"), member_with_token("bob")
    with serving() as (base, _):
        def get(path):
            return httpx.get(f"{base}{path}", headers=bob).json()

        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
        httpx.post(f"{base}/v0/spaces/lab/join", headers=bob)
        rules = {"rules": [{"action": "hold", "content_pattern": "secret"},
                           {"action": "allow", "sender": "@alice", "guidance": "alice runs the lab"}]}
        assert httpx.put(f"{base}/v0/me/inbox/firewall", json=rules, headers=bob).status_code == 200
        direct = httpx.post(f"{base}/v0/spaces/lab/direct", json={"member": "@bob"},
                            headers=alice).json()["conversation"]["id"]
        # when
        for body in ("the secret plan", "classify me"):
            httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": body}, headers=alice)
        # then: the worker admits one, with its guidance, and holds the other (bounded wait)
        deadline = time.monotonic() + 30
        while not (items := get("/v0/me/inbox")["items"]):
            assert time.monotonic() < deadline, "the worker never classified the item"
            time.sleep(0.2)
        assert [(i["item"]["content"], i["guidance"]) for i in items] == [("classify me", "alice runs the lab")]
        (held,) = get("/v0/me/inbox/held")["items"]
        assert inbox_paths(get) == dict.fromkeys(inbox_paths(get), ["classify me"])
        assert httpx.get(f"{base}/v0/inbox-events/evt_{held['deliveryToken'][4:]}",
                         headers=bob).status_code == 404
        # and once released, every path shows both, in the order sent
        assert httpx.post(f"{base}/v0/me/inbox/held/release", json={"deliveryToken": held["deliveryToken"]},
                          headers=bob).status_code == 200
        paths = inbox_paths(get)
    assert {path: sorted(bodies) for path, bodies in paths.items()} == dict.fromkeys(
        paths, ["classify me", "the secret plan"])


@pytest.mark.postgres
def test_a_server_hears_the_log_topic_through_one_subscription_until_it_stops(settings):
    """A server process's long-polls and live pages hear of every process's
    commits through one subscription to the log topic (Redis pub/sub),
    made when something first waits. Stopped (SIGTERM, as a service manager
    stops it), its subscription is gone with its connection."""
    # given: a server whose long-poll started its log watcher
    import redis

    from controlplane.live import LOG_TOPIC
    from controlplane.topics import redis_channel
    client, channel = redis.Redis.from_url(settings.REDIS_URL), redis_channel(LOG_TOPIC)

    def subscribers() -> int:
        return dict(client.pubsub_numsub(channel))[channel.encode()]

    before = subscribers()  # a server another test stopped may still be leaving
    bob = member_with_token("bob")
    with serving("--no-worker") as (base, process):
        cursor = httpx.get(f"{base}/v0/me/inbox/events", headers=bob).json()["cursor"]
        assert httpx.get(f"{base}/v0/me/inbox/events", params={"cursor": cursor, "wait_ms": 200}, headers=bob,
                         timeout=10).status_code == 200
        # the watcher subscribes on its own task
        wait_until(lambda: subscribers() == before + 1, "the server's log watcher never subscribed to the log topic",
                   seconds=10)
        # when
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    # then
    wait_until(lambda: subscribers() <= before, "the stopped server's subscription stayed")


@pytest.mark.postgres
def test_a_servers_live_pages_read_on_one_connection_of_its_own_until_it_stops():
    """On PostgreSQL a server process's live passes read on one connection
    of its event loop (controlplane.loop_reads), however many sockets
    and sends: not one per pass or per socket. It ends with the server."""
    import asyncio

    import aiohttp

    from bench.live import PASSWORD
    from bench.live import _sign_in as sign_in
    from controlplane.db import plain_rows
    from controlplane.loop_reads import LoopReads

    def loop_connections(since) -> int:
        return plain_rows("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                          "AND datname = current_database() AND backend_start >= %s",
                          [LoopReads.APPLICATION_NAME, since])[0][0]

    owner = member_with_token("owner")
    reader = {"Authorization": f"Bearer {member_token('reader', kind='human', password=PASSWORD)}"}

    async def watch_and_send(base: str, conversation: str, sends: int) -> list[list[str]]:
        session_id = await sign_in(base, "reader")
        socket_url = f"{base.replace('http://', 'ws://')}/ws/conversations/{conversation}/?after=0"
        async with aiohttp.ClientSession() as http:
            sockets = [await http.ws_connect(socket_url, headers={"Cookie": f"sessionid={session_id}"})
                       for _ in range(3)]
            for ws in sockets:
                while (await ws.receive_json(timeout=10))["type"] != "live":
                    pass
            for n in range(sends):
                async with http.post(f"{base}/v0/spaces/lab/conversations/%23general/messages",
                                     json={"body": f"m{n}"}, headers=owner) as response:
                    assert response.status == 201
            seen = []
            for ws in sockets:
                ids = []
                while len(ids) < sends:
                    frame = await ws.receive_json(timeout=10)
                    if frame["type"] == "message":
                        ids.append(frame["id"])
                seen.append(ids)
                await ws.close()
            return seen

    started = plain_rows("SELECT now()", [])[0][0]  # an earlier server's may still be closing
    with serving("--no-worker", "--workers", "1") as (base, process):
        assert httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=owner).status_code == 201
        assert httpx.post(f"{base}/v0/spaces/lab/join", headers=reader).status_code == 201
        channel = httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=owner).json()
        # when: three sockets follow the channel through ten sends
        seen = asyncio.run(watch_and_send(base, channel["conversation"]["id"], 10))
        # then: every socket saw every message, read on one connection
        assert len(seen) == 3 and seen[0] == seen[1] == seen[2] and len(set(seen[0])) == 10
        assert loop_connections(started) == 1
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    wait_until(lambda: loop_connections(started) == 0, "the stopped server's loop connection stayed")

