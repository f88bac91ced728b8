import os
import signal

import pytest

from controlplane import processes
from controlplane.processes import StopRequest, record_early_interrupts


@pytest.fixture
def restored_signals(monkeypatch):
    monkeypatch.setattr(processes, "_interrupted_early", False)
    saved = {signum: signal.getsignal(signum) for signum in StopRequest.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_ctrl_c_python_dropped_during_start_up_still_stops_the_command(restored_signals):
    # given
    record_early_interrupts()
    # when: the KeyboardInterrupt is swallowed, as Python does when it lands
    # in an import lock's callback
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)  # let the handler run here
    except KeyboardInterrupt:
        pass
    # then
    assert StopRequest().requested


def test_without_an_early_ctrl_c_the_command_runs(restored_signals):
    record_early_interrupts()
    assert not StopRequest().requested
