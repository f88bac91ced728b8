"""Fault points for the fault matrix (`make chaos`, docs/reliability.md).

Off, and free, unless `SWITCHBOARD_FAULTS` names a directory, which only the
matrix sets, one directory per process it starts. Then:

- `point(name)` SIGKILLs this process if a file `name` is there (taking the
  file first, so one arming kills one process once): the matrix arms a point
  to kill a process exactly between two steps (a send committed and not
  answered, a webhook answered and not recorded, a barrier between batches).
- `clock_skew()` is what the file `clock-skew` holds, in seconds: the matrix
  moves one process's clock (controlplane.clock) past leases and expiries.
"""
from __future__ import annotations

import datetime as dt
import os
import signal
import time

DIRECTORY = os.environ.get("SWITCHBOARD_FAULTS") or None
SKEW_FILE = "clock-skew"
SKEW_RECHECK_SECONDS = 0.2

_skew = dt.timedelta(0)
_skew_read_at = float("-inf")


def point(name: str) -> None:
    if DIRECTORY is None:
        return
    try:
        os.unlink(os.path.join(DIRECTORY, name))
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def clock_skew() -> dt.timedelta:
    global _skew, _skew_read_at
    if DIRECTORY is None:
        return _skew
    if time.monotonic() - _skew_read_at >= SKEW_RECHECK_SECONDS:
        try:
            with open(os.path.join(DIRECTORY, SKEW_FILE)) as f:
                _skew = dt.timedelta(seconds=float(f.read().strip() or 0))
        except (FileNotFoundError, ValueError):
            _skew = dt.timedelta(0)
        _skew_read_at = time.monotonic()
    return _skew
