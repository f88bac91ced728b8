"""Several worker processes at once on PostgreSQL: every due wake is sent
exactly once (claims use SKIP LOCKED), and `serve`'s timer shares a backlog
with a helper in its other worker."""
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from controlplane import services
from controlplane.clock import now
from tests.servers import ROOT, server_env, serving
from webhooks.models import Attempt, Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
WAKES = 240
WORKERS = 4
PUMP = "import asyncio; from webhooks import pump; print(asyncio.run(pump.run(seconds=60, wait=False)))"


def members(count: int) -> list:
    """Members for the wakes: one member's take no more than half a claim (webhooks.engine.PER_OWNER)."""
    return [services.create_member(f"owner{n}", actor=None) for n in range(count)]


def test_concurrent_workers_never_send_a_wake_twice(receiver, https_receiver):
    # given: 240 due wakes, for 240 subscriptions of 8 members over 24 endpoints
    endpoints = Endpoint.objects.bulk_create(Endpoint(owner=owner, url=receiver.url(f"/hook/{n}"))
                                             for n, owner in enumerate(members(8) * 3))
    subscriptions = Subscription.objects.bulk_create(
        Subscription(owner=endpoints[n % 24].owner, endpoint=endpoints[n % 24], kind="inbox", status="active",
                     activation_position=0)
        for n in range(WAKES))
    Delivery.objects.bulk_create(Delivery(subscription=s, after_position=0, through_position=1, state="pending",
                                          due_at=now()) for s in subscriptions)
    env = server_env(WEBHOOK_CA_BUNDLE=str(https_receiver[1]), WEBHOOK_ALLOW_PRIVATE_NETWORKS="1")
    # when: four worker processes pump at once
    workers = [subprocess.Popen([sys.executable, "manage.py", "shell", "-c", PUMP], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(WORKERS)]
    results = [w.communicate(timeout=120) for w in workers]
    # then: each wake was sent once, and they shared the work
    assert all(w.returncode == 0 for w in workers), [err for _, err in results]
    sent = [int(out.strip().splitlines()[-1]) for out, _ in results]
    assert sum(sent) == WAKES and sum(1 for n in sent if n) >= 2
    ids = Counter(r.headers["Webhook-Id"] for r in receiver.requests)
    assert len(ids) == WAKES and set(ids.values()) == {1}
    assert Attempt.objects.count() == WAKES and set(Attempt.objects.values_list("number", flat=True)) == {1}
    assert set(Delivery.objects.values_list("state", flat=True)) == {"delivered"}


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: one timer for the cluster, and its helper")
def test_a_backlog_the_timer_cannot_hold_is_shared_with_a_helper_in_the_other_worker(receiver, https_receiver,
                                                                                     monkeypatch):
    """With Redis, `serve`'s cluster has one timer, and new wakes queue no
    task while it runs: a timer whose claim fills its room asks for a helper
    run (webhooks.tasks.assist), which another worker process takes."""
    from django_q.conf import Conf
    from django_q.models import Task
    from django_q.tasks import async_task

    from webhooks import due, tasks

    monkeypatch.setattr(Conf, "SYNC", False)  # this process queues tasks for serve's cluster, and runs none

    # given: 480 wakes of 8 members over 120 endpoints (four in flight each, 32 a member),
    # answered after 0.3 s: ten of the timer's rooms (64) for three seconds
    def slowly(received):
        time.sleep(0.3)
        return 202, {}, b"{}"

    receiver.respond = slowly
    endpoints = Endpoint.objects.bulk_create(Endpoint(owner=owner, url=receiver.url(f"/hook/{n}"))
                                             for n, owner in enumerate(members(8) * 15))
    subscriptions = Subscription.objects.bulk_create(
        Subscription(owner=endpoints[n % 120].owner, endpoint=endpoints[n % 120], kind="inbox", status="active",
                     activation_position=0)
        for n in range(480))
    cache.delete(due.HELPER_KEY)
    with serving(WEBHOOK_CA_BUNDLE=str(https_receiver[1]), WEBHOOK_ALLOW_PRIVATE_NETWORKS="1"):
        # and a timer running in one of the cluster's two workers: of the
        # three runs (each worker's first, webhooks.tasks.resume, and this
        # one) one is the timer, and the other two have ended
        async_task("webhooks.tasks.deliver")
        deadline = time.monotonic() + 30
        while not cache.get(due.TIMER_KEY) or Task.objects.count() < 2:
            assert time.monotonic() < deadline, "no timer started"
            time.sleep(0.1)
        # a worker's first run that found the key waits for it to change, then
        # sends what is due as it ends: let any such one end before the
        # backlog commits, or it takes the helper's share
        time.sleep(tasks.TIMER_KEY_SECONDS + 4 * tasks.RESUME_POLL_SECONDS)
        # when: they commit, which nudges the timer and queues no task (a timer runs)
        with transaction.atomic():
            Delivery.objects.bulk_create(Delivery(subscription=s, after_position=0, through_position=1,
                                                  state="pending", due_at=now()) for s in subscriptions)
            due.kick_on_commit()
        receiver.wait_for(lambda requests: len(requests) >= 480, timeout=60)
        # then: a helper run sent part of them, beside the timer's run (still going)
        deadline = time.monotonic() + 30
        while not (helpers := list(Task.objects.filter(func="webhooks.tasks.assist"))):
            assert time.monotonic() < deadline, "no helper run finished"
            time.sleep(0.2)
    runs = list(Task.objects.values_list("func", "success", "result"))
    assert all(h.success for h in helpers) and 0 < sum(h.result for h in helpers) < 480, runs
    ids = Counter(r.headers["Webhook-Id"] for r in receiver.requests)
    assert len(ids) == 480 and set(ids.values()) == {1}
