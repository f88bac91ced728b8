"""The delivery timer's run: nudged by new wakes, ended by a stopping
worker, going on after its connection was cut, and the one task queued
only while no timer runs."""
import asyncio
import datetime as dt
import threading
import time

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connections

from controlplane import processes
from inbox.services import send_message
from tests.webhooks.scene import pump
from webhooks import due
from webhooks import pump as timer_loop
from webhooks.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the nudge reaches the timer through channels-redis")
def test_the_running_timer_sends_a_new_wake_when_nudged_not_at_its_next_poll(world, receiver, monkeypatch):
    # given: a timer whose poll outlasts its run, and sends that nudge it (no worker task)
    monkeypatch.setattr(timer_loop, "NUDGED_POLL_SECONDS", 3.0)
    monkeypatch.setattr("webhooks.due.kick_on_commit", due.nudge_timer_on_commit)
    timer = threading.Thread(target=lambda: (pump(wait=True, seconds=1.5), connections.close_all()))
    timer.start()
    time.sleep(0.5)  # the timer is waiting, its channel in the group
    # when
    send_message(world["general"], body="now, please", actor=world["bob"])
    timer.join(10)
    # then: the timer sent it within its run, long before its poll would have looked
    (wake,) = receiver.wakes()
    assert wake.json()["type"] == "spaces.events.available"


def test_a_stopping_worker_ends_the_timer_run_at_once_having_recorded_what_it_sent(world, receiver, monkeypatch):
    # given: a timer on a long run, in a process whose cluster shares the stop event
    monkeypatch.setattr(processes, "_cluster_stopping", None)  # as it was, after the test
    stopping = processes.share_stop_with_forks()
    timer = threading.Thread(target=lambda: (pump(wait=True, seconds=600), connections.close_all()))
    timer.start()
    send_message(world["general"], body="before the stop", actor=world["bob"])
    receiver.wait_for(lambda requests: len(requests) == 1)
    # when: the worker command stops its cluster
    stopping.set()
    timer.join(20)
    # then: the run ended long before its 600 s, and the wake it sent is recorded
    assert not timer.is_alive()
    assert Delivery.objects.get().state == Delivery.State.DELIVERED


def test_a_new_wake_queues_a_delivery_task_only_when_no_timer_runs(monkeypatch):
    # given: a channel layer and cache shared between processes, as with Redis
    kicked = []
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: True)
    monkeypatch.setattr("controlplane.live.kick", lambda task, *args: kicked.append(task))
    cache.delete(due.TIMER_KEY)
    # when / then: no timer, a task; a timer holding its key, none (it was nudged)
    due._kick_unless_timed()
    assert kicked == ["webhooks.tasks.deliver"]
    cache.add(due.TIMER_KEY, 1, timeout=10)
    try:
        due._kick_unless_timed()
        assert kicked == ["webhooks.tasks.deliver"]
    finally:
        cache.delete(due.TIMER_KEY)
    # and without a shared layer the key says nothing about other processes: always a task
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: False)
    cache.add(due.TIMER_KEY, 1, timeout=10)
    try:
        due._kick_unless_timed()
        assert kicked == ["webhooks.tasks.deliver"] * 2
    finally:
        cache.delete(due.TIMER_KEY)


@pytest.mark.postgres
def test_the_timer_goes_on_with_a_fresh_connection_after_its_own_was_cut(world, receiver):
    """A database restart mid-run drops the timer's connection: its next claim
    fails, and the timer goes on with a fresh one instead of ending its run
    (and leaving the wakes to the next run or the sweep)."""
    from tests.servers import cut_every_database_connection

    def cut_then_send():
        cut_every_database_connection()
        connections["default"].close_pool()
        send_message(world["general"], body="after the cut", actor=world["bob"])
        connections.close_all()

    async def scenario():
        timer = asyncio.create_task(timer_loop.run(seconds=5.0, wait=True))
        await asyncio.sleep(1.0)  # the timer is polling on its own connection
        await asyncio.to_thread(cut_then_send)
        return await timer

    # when
    sent = asyncio.run(scenario())
    connections["default"].close()  # this thread's was cut too
    connections["default"].close_pool()
    # then: the wake of the message sent after the cut went out in the same run
    assert sent == 1
    (wake,) = receiver.wakes()
    assert Delivery.objects.get().state == "delivered" and wake.json()["type"] == "spaces.events.available"


@pytest.mark.parametrize("shared, sent, due_soon, handed_over", [
    (True, 3, False, True), (True, 0, True, True), (True, 0, False, False),
    (False, 3, False, False), (False, 0, True, True)])
def test_a_timer_run_hands_over_while_it_sent_anything_or_anything_falls_due(monkeypatch, shared, sent, due_soon,
                                                                            handed_over):
    # given: a run that becomes the timer, sends `sent` wakes and ends; with
    # a shared layer and cache (Redis) it is the cluster's one timer
    from django_q import tasks as q_tasks

    from webhooks import engine, tasks

    queued = []
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: shared)
    monkeypatch.setattr(q_tasks, "async_task", lambda name, *args: queued.append(name))
    monkeypatch.setattr(tasks.mcp, "offer_waiting", lambda: None)

    async def run(seconds, wait, renew, hand_over, ask_for_help):
        assert wait and seconds == (tasks.RUN_SECONDS if shared else tasks.LOCAL_RUN_SECONDS)
        # only the cluster's one timer asks for helpers: without a shared cache every worker may be a timer
        assert ask_for_help is (tasks.ask_for_help if shared else None)
        return sent

    monkeypatch.setattr(tasks.pump, "run", run)
    monkeypatch.setattr(engine, "next_due_in", lambda horizon: 1.0 if due_soon else None)
    cache.delete(due.TIMER_KEY)
    # when
    assert tasks.deliver() == sent
    # then: the cluster's timer hands over after a run that sent something
    # (more is likely to come); any timer does when it leaves something due,
    # and an idle one lets the timer lapse
    assert queued == (["webhooks.tasks.deliver"] if handed_over else [])
    assert cache.get(due.TIMER_KEY) is None


def test_runs_that_start_while_the_next_timer_is_queued_leave_the_timer_to_it(monkeypatch):
    """With one worker the queue runs one task at a time, so each minute's
    sweep found the timer's key free and became a timer too, queueing a next
    run of its own: a chain more a minute, and the queue grew without end."""
    from django_q import tasks as q_tasks

    from webhooks import engine, tasks

    queued, runs, kicked = [], [], []
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: True)
    monkeypatch.setattr("controlplane.live.kick", lambda task, *args: kicked.append(task))
    monkeypatch.setattr(q_tasks, "async_task", lambda name, *args: queued.append(args))
    monkeypatch.setattr(tasks.mcp, "offer_waiting", lambda: None)
    monkeypatch.setattr(engine, "next_due_in", lambda horizon: None)

    async def run(seconds, wait, **kwargs):
        runs.append(wait)
        return 1  # each run sent something

    monkeypatch.setattr(tasks.pump, "run", run)
    cache.delete_many([due.TIMER_KEY, due.SUCCESSOR_KEY])
    # given: a timer's run that ends having sent, so it queues the next
    tasks.deliver()
    (token,) = queued.pop()
    # when: the minute's sweep and a kick come before that run starts, and then it starts
    tasks.deliver()
    due._kick_unless_timed()
    tasks.deliver(token)
    # then: the sweep sent what was due and queued nothing; the kick queued nothing; the next run was the timer
    assert runs == [True, False, True] and kicked == []
    assert len(queued) == 1 and queued[0] != (token,)


def test_a_timer_whose_time_is_up_hands_over_before_its_slowest_send_answers(world, receiver):
    """A run whose time was up waited for its sends in flight, up to a
    request's 15 s, keeping the timer's key: nothing else was sent, to
    anyone, meanwhile (a slow receiver held up every other's wakes)."""
    # given: a wake due to a receiver that answers after 3 s
    answered = []

    def slowly(received):
        time.sleep(3)
        answered.append(time.monotonic())
        return 200, {}, b""

    receiver.respond = slowly
    send_message(world["general"], body="to a slow receiver", actor=world["bob"])
    handed = []
    # when: a timer run of half a second sends it
    asyncio.run(timer_loop.run(seconds=0.5, wait=True, hand_over=lambda: handed.append(time.monotonic())))
    connections.close_all()
    # then: the run handed over once its time was up, before the answer, and still recorded it
    assert len(handed) == 1 and len(answered) == 1 and handed[0] < answered[0]
    assert Delivery.objects.get().state == Delivery.State.DELIVERED


def test_a_running_timer_signs_with_a_key_rotated_during_its_run(world, receiver, monkeypatch):
    """A run signed every wake with the key it started with, for 40 s and
    more: an emergency rotation did not take effect until the next run."""
    from webhooks.crypto import active_signing_key, rotate_signing_key

    # given: a timer run under way, signing with the active key
    monkeypatch.setattr(timer_loop, "KEY_SECONDS", 0.1)
    old = active_signing_key()
    timer = threading.Thread(target=lambda: (pump(wait=True, seconds=3.0), connections.close_all()))
    timer.start()
    send_message(world["general"], body="before the rotation", actor=world["bob"])
    receiver.wait_for(lambda requests: len(requests) == 1)
    # when: the key is rotated, and another wake falls due in the same run
    new = rotate_signing_key()
    time.sleep(0.5)
    send_message(world["general"], body="after the rotation", actor=world["bob"])
    receiver.wait_for(lambda requests: len(requests) == 2)
    timer.join(10)
    # then
    assert [wake.headers["Webhook-Key-Id"] for wake in receiver.wakes()] == [old.key_id, new.key_id]


def test_a_timer_whose_claim_fills_its_room_asks_for_a_helper_at_most_once_a_second(receiver, make_member,
                                                                                    monkeypatch):
    # given: room for four sends, and ten due wakes on ten endpoints
    from controlplane.clock import now
    from webhooks.models import Endpoint, Subscription

    monkeypatch.setattr(timer_loop, "MAX_IN_FLIGHT", 4)
    monkeypatch.setattr(timer_loop, "ASK_SECONDS", 60.0)
    owner = make_member("ada")
    for n in range(10):
        endpoint = Endpoint.objects.create(owner=owner, url=receiver.url(f"/hook/{n}"))
        subscription = Subscription.objects.create(owner=owner, endpoint=endpoint, kind="inbox", status="active",
                                                   activation_position=0)
        Delivery.objects.create(subscription=subscription, after_position=0, through_position=1, due_at=now())
    asked = []
    # when: a run claims four, four (within the second) and two
    sent = asyncio.run(timer_loop.run(seconds=10, wait=False, ask_for_help=lambda: asked.append(time.monotonic())))
    # then: the first full claim asked for a helper, the second (at least) was within ASK_SECONDS of it
    assert sent == 10 and len(receiver.wakes()) == 10
    assert len(asked) == 1
    # and without the pause every full claim asks: of ten more, at least the first two claims are full
    # (four, then as many as have finished, with six left)
    monkeypatch.setattr(timer_loop, "ASK_SECONDS", 0.0)
    for subscription in Subscription.objects.all():
        Delivery.objects.create(subscription=subscription, after_position=1, through_position=2, due_at=now())
    asked.clear()
    assert asyncio.run(timer_loop.run(seconds=10, wait=False, ask_for_help=lambda: asked.append(0))) == 10
    assert len(asked) >= 2
    # and a run that finds less than its room never asks
    asked.clear()
    Delivery.objects.create(subscription=subscription, after_position=2, through_position=3, due_at=now())
    assert asyncio.run(timer_loop.run(seconds=10, wait=False, ask_for_help=lambda: asked.append(0))) == 1
    assert asked == []


def test_the_timer_asks_for_one_helper_run_at_a_time(monkeypatch, caplog):
    # given
    from django_q import tasks as q_tasks

    from webhooks import tasks

    queued, runs = [], []
    monkeypatch.setattr(q_tasks, "async_task", lambda name, *args: queued.append((name, *args)))

    async def run(seconds, wait, linger):
        runs.append((seconds, wait, linger))
        return 3

    monkeypatch.setattr(tasks.pump, "run", run)
    cache.delete(due.HELPER_KEY)
    try:
        # when: the timer asks twice while its helper is queued or running
        tasks.ask_for_help()
        tasks.ask_for_help()
        ((name, token),) = queued
        assert name == "webhooks.tasks.assist"
        # then the helper runs (sending what is due, lingering a while, not staying) and ends,
        # and the timer asks again
        assert tasks.assist(token) == 3 and runs == [(tasks.HELP_SECONDS, False, tasks.HELP_LINGER_SECONDS)]
        tasks.ask_for_help()
        assert len(queued) == 2 and queued[1][1] != token
        # and a helper whose key lapsed meanwhile (and the timer asked again) leaves the newer one's alone
        async def overtaken(seconds, wait, linger):
            assert cache.get(due.HELPER_KEY) == queued[1][1]  # held again from its start
            cache.set(due.HELPER_KEY, "newer")
            return 1

        monkeypatch.setattr(tasks.pump, "run", overtaken)
        assert tasks.assist(queued[1][1]) == 1 and cache.get(due.HELPER_KEY) == "newer"
    finally:
        cache.delete(due.HELPER_KEY)
    # and a broker that fails only costs the help, and leaves no key that would stop the next asking
    monkeypatch.setattr(q_tasks, "async_task", lambda *args: 1 / 0)
    tasks.ask_for_help()
    assert cache.get(due.HELPER_KEY) is None and "could not ask for a helper" in caplog.text
    # as does a cache that fails
    monkeypatch.setattr(tasks.cache, "add", lambda *args, **kwargs: 1 / 0)
    tasks.ask_for_help()
    assert len(queued) == 2


def test_a_lingering_run_sends_what_falls_due_soon_after_its_last_send(world, receiver):
    # given: a run that lingers three seconds after its last send, and a wake due now
    send_message(world["general"], body="first", actor=world["bob"])
    sent = []
    run = threading.Thread(target=lambda: (sent.append(asyncio.run(timer_loop.run(seconds=30, wait=False,
                                                                                    linger=3.0))),
                                           connections.close_all()))
    started = time.monotonic()
    run.start()
    deadline = time.monotonic() + 10
    while Delivery.objects.filter(state=Delivery.State.DELIVERED).count() < 1:
        assert time.monotonic() < deadline, "the first wake was not recorded"
        time.sleep(0.05)
    # when: the next wake commits after the first was sent and recorded
    send_message(world["general"], body="second", actor=world["bob"])
    run.join(30)
    # then: the same run sent it, and left a few seconds later (not after its thirty)
    assert sent == [2] and len(receiver.wakes()) == 2
    assert time.monotonic() - started < 15


def test_a_helper_run_ends_within_its_window():
    # A helper gives its worker back to the tasks queued behind it
    # (webhooks.tasks.HELP_SECONDS), fits in a task with a send at its end,
    # and a helper that never ends (killed) blocks the next one only for a while.
    from webhooks import tasks, transport

    assert tasks.HELP_LINGER_SECONDS < tasks.HELP_SECONDS < tasks.RUN_SECONDS
    assert tasks.HELP_SECONDS + transport.TOTAL_TIMEOUT < tasks.HELPER_KEY_SECONDS < 60
    assert tasks.HELP_SECONDS + transport.TOTAL_TIMEOUT + 2 < settings.Q_CLUSTER["timeout"]


def test_a_timer_run_and_a_send_at_its_end_fit_in_a_task():
    # A run ends after RUN_SECONDS plus the sends still in flight (at most the
    # transport's total timeout each): django-q2 kills a task past its timeout.
    from webhooks import tasks, transport

    assert tasks.RUN_SECONDS + transport.TOTAL_TIMEOUT + 2 < settings.Q_CLUSTER["timeout"]



def test_the_timer_waits_for_the_soonest_wake_whose_subscription_may_send(make_member):
    # given: a wake due in 20 s whose subscription is suspended, one due in 30 s
    # whose lease ran out, and one due in 40 s of an active subscription
    from controlplane.clock import now
    from webhooks import engine
    from webhooks.models import Endpoint, Subscription

    owner = make_member("ada")
    endpoint = Endpoint.objects.create(owner=owner, url="https://hooks.example.com/w")
    for status, lease, due_in in (("suspended", None, 20), ("active", now() - dt.timedelta(seconds=1), 30),
                                  ("active", now() + dt.timedelta(hours=1), 40)):
        subscription = Subscription.objects.create(owner=owner, endpoint=endpoint, kind="inbox", status=status,
                                                   activation_position=0, lease_expires_at=lease)
        Delivery.objects.create(subscription=subscription, after_position=0, through_position=1,
                                due_at=now() + dt.timedelta(seconds=due_in))
    # when / then
    assert 35 < engine.next_due_in(60) <= 40
    assert engine.next_due_in(30) is None

@pytest.mark.postgres
def test_the_timer_looks_for_its_next_due_wake_without_reading_every_subscription(make_member):
    # given: a young database, as a benchmark's was (no statistics gathered),
    # with 1,000 subscriptions, 4,000 finished wakes (still in the due index
    # until a vacuum: each was pending there first) and one open wake due in 30 s
    from django.db import connection

    from controlplane.clock import now
    from webhooks import engine
    from webhooks.models import Endpoint, Subscription

    owner = make_member("ada")
    endpoint = Endpoint.objects.create(owner=owner, url="https://hooks.example.com/w")
    subscriptions = Subscription.objects.bulk_create(
        Subscription(owner=owner, endpoint=endpoint, kind="inbox", status="active", activation_position=0,
                     debounce_ms=0) for _ in range(1000))
    Delivery.objects.bulk_create(Delivery(subscription=subscriptions[n % 1000], after_position=n,
                                          through_position=n + 1, state=Delivery.State.PENDING, due_at=now())
                                 for n in range(4000))
    Delivery.objects.update(state=Delivery.State.DELIVERED)
    Delivery.objects.create(subscription=subscriptions[0], after_position=4000, through_position=4001,
                            due_at=now() + dt.timedelta(seconds=30))
    statements = []

    def record(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    # when
    with connection.execute_wrapper(record):
        due_in = engine.next_due_in(60)
    # then: the open wake is found...
    assert 25 < due_in <= 30
    # ...reading the subscription of that candidate only, whatever plan the
    # statistics allow: per candidate (a subplan), never joined to the
    # deliveries (which, planned on the tables as they are here, read all 1,000)
    read, joined = 0, 0
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            nodes = [(cursor.fetchone()[0][0]["Plan"], False)]
            while nodes:
                node, per_candidate = nodes.pop()
                per_candidate = per_candidate or node.get("Parent Relationship") == "SubPlan"
                nodes += [(child, per_candidate) for child in node.get("Plans", [])]
                if node.get("Relation Name") == Subscription._meta.db_table:
                    read += node["Actual Rows"] * node["Actual Loops"]
                    joined += not per_candidate
    assert (read, joined) == (1, 0)
