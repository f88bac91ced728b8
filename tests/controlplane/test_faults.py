"""The fault matrix's points (controlplane.faults): off unless a process is
started with SWITCHBOARD_FAULTS; then an armed point kills that process
once, and the skew file moves its clock."""
import signal
import subprocess
import sys

from tests.servers import ROOT

SCRIPT = """
import datetime as dt
from controlplane import clock, faults
print(round((clock.now() - dt.datetime.now(dt.timezone.utc)).total_seconds() / 60), flush=True)
faults.point("send.committed")
print("alive")
"""


def run(env):
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=30)


def test_an_armed_point_kills_its_process_once_and_the_skew_moves_its_clock(tmp_path):
    # given: a point armed and the clock an hour ahead
    (tmp_path / "send.committed").touch()
    (tmp_path / "clock-skew").write_text("3600")
    env = {"SWITCHBOARD_FAULTS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    # when
    first, second = run(env), run(env)
    # then: the first process died at the point (and took the arming with it); the second passed it
    assert first.returncode == -signal.SIGKILL and first.stdout.split() == ["60"]
    assert second.returncode == 0 and second.stdout.split() == ["60", "alive"]
    assert not (tmp_path / "send.committed").exists()


def test_without_the_variable_nothing_is_read(tmp_path):
    (tmp_path / "send.committed").touch()
    result = run({"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.split() == ["0", "alive"]
    assert (tmp_path / "send.committed").exists()
