"""The one clock. Tests move it with `freeze(at)`, the fault matrix with
`controlplane.faults.clock_skew`; nothing else reads the time of day
(elapsed time is time.monotonic())."""
from __future__ import annotations

import contextlib
import datetime as dt

from controlplane import faults

_frozen: dt.datetime | None = None


def now() -> dt.datetime:
    if _frozen is not None:
        return _frozen
    if faults.DIRECTORY is None:
        return dt.datetime.now(dt.timezone.utc)
    return dt.datetime.now(dt.timezone.utc) + faults.clock_skew()


def timestamp() -> float:
    """`now()` as Unix seconds (signatures, rate-limit windows, HTTP dates).
    Durations and timeouts use time.monotonic(), which no wall clock moves."""
    return now().timestamp()


@contextlib.contextmanager
def freeze(at: dt.datetime):
    global _frozen
    previous, _frozen = _frozen, at
    try:
        yield
    finally:
        _frozen = previous


def rfc3339(value: dt.datetime | None) -> str | None:
    """RFC 3339 UTC with milliseconds, e.g. 2026-11-30T02:25:45.123Z."""
    if value is None:
        return None
    value = value.astimezone(dt.timezone.utc)
    # (strftime's %Y does not pad years before 1000: year 1 was "1-01-01…")
    return f"{value.year:04d}-" + value.strftime("%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
