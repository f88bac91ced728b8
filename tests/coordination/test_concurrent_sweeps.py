"""Several sweeping processes at once on PostgreSQL: one check-in per
(task, claimant, update time), however the scans interleave."""
import datetime as dt
import subprocess
import sys

import pytest

from controlplane.clock import freeze, now
from controlplane.log import Event
from coordination import services as tasks
from coordination.models import CheckinReceipt
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
