"""The periodic sweeps: scheduled once, and doing what they say."""
import datetime as dt
import importlib
import threading

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django_q.models import Schedule

from controlplane import tasks
from controlplane.clock import freeze, now
from controlplane.models import Event, IdempotencyRecord, LogHead
from controlplane.schedules import declared_schedules, ensure_schedules
from inbox.services import send_message

WORKERS = 6


def test_schedules_are_created_once(db):
    ensure_schedules()
    ensure_schedules()
    assert set(Schedule.objects.values_list("name", flat=True)) == {"prune-event-log", "purge-idempotency-records",
                                                                   "classify-inbox-items", "expire-grants",
                                                                   "deliver-webhooks", "sweep-claims",
                                                                   "reap-deleted-webhooks",
                                                                   "finish-collectives", "clear-expired-sessions"}


def test_the_reapers_earlier_schedule_is_renamed_rather_than_left_behind(db):
    # given: the schedule an earlier version created
    migration = importlib.import_module("webhooks.migrations.0008_reap_deleted_webhooks_schedule")
    Schedule.objects.create(name="reap-deleted-mcp-subscriptions", func="webhooks.tasks.reap_deleted_mcp_subscriptions",
                            schedule_type=Schedule.MINUTES, minutes=60, repeats=-1)
    # when
    migration.rename(migration.OLD, migration.NEW)(django_apps, None)
    ensure_schedules()
    # then
    assert list(Schedule.objects.filter(name__startswith="reap-").values_list("name", "func")) == [
        ("reap-deleted-webhooks", "webhooks.tasks.reap_deleted")]


def test_duplicate_schedules_an_earlier_race_left_are_removed(db):
    ensure_schedules()
    Schedule.objects.create(name="deliver-webhooks", func="webhooks.tasks.deliver", schedule_type=Schedule.MINUTES,
                            minutes=1, repeats=-1)
    ensure_schedules()
    assert Schedule.objects.filter(name="deliver-webhooks").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_workers_starting_together_create_each_schedule_once():
    # given: several workers' start-ups at the same moment
    start, errors = threading.Barrier(WORKERS), []

    def worker_start():
        try:
            start.wait()
            ensure_schedules()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker_start) for _ in range(WORKERS)]
    # when
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then
    assert errors == []
    names = list(Schedule.objects.values_list("name", flat=True))
    assert len(names) == len(set(names)) == len(declared_schedules())


def test_prune_event_log_honours_retention_days(settings, general, alice):
    # given
    settings.EVENT_RETENTION_DAYS = 7
    with freeze(now() - dt.timedelta(days=8)):
        old = send_message(general, body="old", actor=alice).message
    recent = send_message(general, body="recent", actor=alice).message
    # when
    tasks.prune_event_log()
    # then
    assert not Event.objects.filter(position__lte=old.position).exists()
    assert Event.objects.filter(position=recent.position).exists()
    assert LogHead.objects.get().floor >= old.position


def test_a_retention_of_0_days_keeps_every_event(settings, general, alice):
    settings.EVENT_RETENTION_DAYS = 0
    with freeze(now() - dt.timedelta(days=400)):
        old = send_message(general, body="old", actor=alice).message
    assert tasks.prune_event_log() == 0
    assert Event.objects.filter(position=old.position).exists() and LogHead.objects.get().floor == 0


def test_idempotency_records_live_at_least_a_day(as_alice):
    as_alice.post("/v0/spaces", {"slug": "lab", "name": "Lab"}, headers={"Idempotency-Key": "keep-me-1"})
    with freeze(now() + dt.timedelta(hours=25)):
        tasks.purge_idempotency_records()
    assert IdempotencyRecord.objects.count() == 1
    with freeze(now() + dt.timedelta(hours=49)):
        tasks.purge_idempotency_records()
    assert IdempotencyRecord.objects.count() == 0
