"""Several worker processes at once on PostgreSQL: every due wake is sent
exactly once (claims use SKIP LOCKED)."""
import subprocess
import sys
from collections import Counter

import pytest

from controlplane import services
from controlplane.clock import now
from tests.servers import ROOT, server_env
from webhooks.models import Attempt, Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
WAKES = 240
WORKERS = 4
PUMP = "import asyncio; from webhooks import pump; print(asyncio.run(pump.run(seconds=60, wait=False)))"


def test_concurrent_workers_never_send_a_wake_twice(receiver, https_receiver):
    # given: 240 due wakes, for 240 subscriptions over 24 endpoints
    owner = services.create_member("alice", actor=None)
    endpoints = Endpoint.objects.bulk_create(Endpoint(owner=owner, url=receiver.url(f"/hook/{n}"))
                                             for n in range(24))
    subscriptions = Subscription.objects.bulk_create(
        Subscription(owner=owner, endpoint=endpoints[n % 24], kind="inbox", status="active", activation_position=0)
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
