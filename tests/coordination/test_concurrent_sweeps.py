"""Several sweeping processes at once on PostgreSQL: one check-in per
(task, claimant, update time), however the scans interleave."""
import datetime as dt
import subprocess
import sys

import pytest

from controlplane.clock import freeze, now
from controlplane.log import Event
from coordination import services as tasks
from coordination.models import CheckinReceipt, Task
from tests.conftest import someone_waits_for_a_lock
from tests.servers import ROOT, server_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SCAN = """
import datetime as dt, os, time
from controlplane.clock import freeze
from coordination import claims
at = dt.datetime.fromisoformat(os.environ["SCAN_AT"])
while time.time() < float(os.environ["SCAN_START"]):
    time.sleep(0.005)
with freeze(at):
    print(claims.scan()["checkins"])
"""


def test_concurrent_scans_emit_one_checkin_per_claim(space, alice, bob):
    # given: 60 claims, all due for their check-in
    start = now()
    with freeze(start):
        for n in range(60):
            task = tasks.create_task(space, title=f"t{n}", actor=alice)
            tasks.claim_task(space, task.public_id, actor=bob)
    env = server_env(SCAN_AT=(start + dt.timedelta(hours=18)).isoformat(),
                     SCAN_START=str(dt.datetime.now().timestamp() + 4))
    # when: four processes scan at the same moment
    scans = [subprocess.Popen([sys.executable, "manage.py", "shell", "-c", SCAN], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    emitted = [int(p.communicate(timeout=60)[0].split()[-1]) for p in scans]
    # then
    assert all(p.returncode == 0 for p in scans)
    assert sum(emitted) == 60
    assert CheckinReceipt.objects.count() == 60
    assert Event.objects.filter(kind="task_claim_checkin").count() == 60


def _slow_claim(space, task, member, monkeypatch):
    """`member` claims `task` in a thread whose transaction stays open a
    second after the claim is written; returns the thread, once written."""
    import threading
    import time

    from django.db import connections

    changed, written = tasks._changed, threading.Event()

    def slow_for_member(task, kind, actor, fields):
        result = changed(task, kind, actor, fields)
        if actor.pk == member.pk:
            written.set()
            time.sleep(1.0)
        return result

    monkeypatch.setattr(tasks, "_changed", slow_for_member)
    thread = threading.Thread(target=lambda: (tasks.claim_task(space, task.public_id, actor=member),
                                              connections.close_all()))
    thread.start()
    assert written.wait(10)
    return thread


def _held_then_raced(holder, racer, reached, release, *, lock_timeout: float = 10.0) -> None:
    """Run `holder` in a thread named "holder" until it sets `reached` (it
    holds its transaction open, waiting for `release`); then `racer` in
    another until it waits for a lock; then let the holder commit, and wait
    for both. Each thread gives its connections back."""
    import threading

    from django.db import connections

    def closing(work):
        def run():
            try:
                work()
            finally:
                connections.close_all()
        return run

    held = threading.Thread(target=closing(holder), name="holder")
    held.start()
    assert reached.wait(10)
    racing = threading.Thread(target=closing(racer))
    racing.start()
    someone_waits_for_a_lock(timeout=lock_timeout)
    release.set()
    held.join(20)
    racing.join(20)


def test_a_claim_taken_over_while_another_claimant_waits_for_the_row_stands(space, alice, bob, carol, monkeypatch):
    """Two members claim work whose claim has expired: carol takes it
    (expiry and claim in one transaction) while bob's request waits for the
    row. Locked with its joins, bob's re-read of the row found carol's
    claim with no claimant, took it for a deleted claimant's, expired it
    and claimed: both were answered 200, and only the last held the task."""
    from controlplane.errors import Conflict

    task = tasks.create_task(space, title="Report", actor=alice)
    tasks.claim_task(space, task.public_id, actor=alice)
    Task.objects.filter(pk=task.pk).update(updated_at=now() - dt.timedelta(hours=25),
                                           sweep_at=now() - dt.timedelta(minutes=1))
    carols = _slow_claim(space, task, carol, monkeypatch)
    # when: bob claims while carol's transaction holds the row
    with pytest.raises(Conflict) as refusal:
        tasks.claim_task(space, task.public_id, actor=bob)
    carols.join(10)
    # then: carol has it, bob was told so, and the log has one expiry
    assert refusal.value.details["claimant"] == "@carol"
    assert Task.objects.get(pk=task.pk).claimant == carol
    assert [e.data.get("claimant") for e in Event.objects.filter(kind="task_claim_expired")] == ["@alice"]


def test_a_change_waiting_for_a_claim_answers_and_logs_its_claimant(space, alice, carol, monkeypatch):
    task = tasks.create_task(space, title="Report", actor=alice)
    carols = _slow_claim(space, task, carol, monkeypatch)
    # when: alice renames it while carol's claim holds the row
    renamed = tasks.update_task(space, task.public_id, {"title": "Report, final"}, actor=alice)
    carols.join(10)
    # then
    assert renamed.claimant == carol
    assert Event.objects.filter(kind="task.updated").get().data["task"]["claimant"] == "@carol"


def test_a_claimants_message_committing_while_the_expiry_decides_keeps_the_claim(space, alice, bob):
    """The expiry read the claimant's messages once, under the task's lock,
    which a message never takes: one that committed between that read and
    the expiry's own commit came first in the log, and the claim expired
    all the same."""
    import threading

    from controlplane import log
    from coordination import claims
    from inbox.services import send_message

    # given: bob's claim, silent for longer than its time
    task = tasks.create_task(space, title="Report", actor=alice)
    tasks.claim_task(space, task.public_id, actor=bob)
    Task.objects.filter(pk=task.pk).update(updated_at=now() - dt.timedelta(hours=25))
    written, release, outcome = threading.Event(), threading.Event(), {}

    def pause_the_senders_commit(entries):
        if threading.current_thread().name == "holder":
            written.set()
            release.wait(10)

    def sends():
        send_message(Task.objects.get(pk=task.pk).conversation, body="still on it", actor=bob)

    def decides():
        outcome["decision"] = claims._decide(task.pk, now())

    log.register_append_hook(pause_the_senders_commit)
    try:
        # when: the expiry decides while bob's message is written and not yet committed
        _held_then_raced(sends, decides, written, release)
    finally:
        log._APPEND_HOOKS.remove(pause_the_senders_commit)
    # then: the message keeps the claim
    assert outcome["decision"] != "expired"
    assert Task.objects.get(pk=task.pk).claimant == bob
    assert not Event.objects.filter(kind="task_claim_expired").exists()


def test_a_claim_racing_its_claimants_removal_is_refused_or_let_go(space, alice, bob):
    """The claim checked its claimant before its transaction: a removal
    committing meanwhile found the task still open and marked nothing, and
    the claim was kept for 18 hours by a member who could neither submit
    nor release it."""
    import threading

    from controlplane import services
    from controlplane.errors import Forbidden

    task = tasks.create_task(space, title="Report", actor=alice)
    reached, release, outcome = threading.Event(), threading.Event(), {}

    def hold_the_removal(sender, **kwargs):  # after coordination's receiver, before the removal commits
        if threading.current_thread().name == "holder":
            reached.set()
            release.wait(10)

    def removes():
        services.remove_member(space, bob, actor=alice)

    def claims():
        try:
            outcome["claim"] = tasks.claim_task(space, task.public_id, actor=bob).status
        except Forbidden:
            outcome["claim"] = "refused"

    services.writer_lost.connect(hold_the_removal, dispatch_uid="test.hold_the_removal")
    try:
        # when: bob claims while his removal holds his membership, not yet committed
        _held_then_raced(removes, claims, reached, release, lock_timeout=3)
    finally:
        services.writer_lost.disconnect(dispatch_uid="test.hold_the_removal")
    # then: the claim waited for the removal and was refused, and the work is open
    assert outcome["claim"] == "refused"
    assert tasks.visible_task(space, task.public_id, alice).status == "open"


def test_a_claimants_tasks_are_marked_under_locks_taken_in_id_order(space, alice, bob):
    """A removal and a suspension of one claimant at once each updated the
    claimant's tasks in the order of its own plan (an index scan, a bitmap
    heap scan) and deadlocked: 4 in 30 rounds on a database with many
    tasks. Both now lock the rows in id order before they update them."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from coordination import claims

    for n in range(3):
        tasks.claim_task(space, tasks.create_task(space, title=f"t{n}", actor=alice).public_id, actor=bob)
    for space_id in (space.pk, None):  # a removal's (one space) and a suspension's (every space)
        with transaction.atomic(), CaptureQueriesContext(connection) as ran:  # as its senders call it
            claims.look_at_claims_of(None, space_id=space_id, member_id=bob.pk)
        locking, updating = (next(i for i, q in enumerate(ran.captured_queries) if marker in q["sql"])
                             for marker in ("FOR NO KEY UPDATE", "UPDATE \"coordination_task\""))
        assert locking < updating and 'ORDER BY 1 ASC FOR NO KEY UPDATE' in ran.captured_queries[locking]["sql"]
