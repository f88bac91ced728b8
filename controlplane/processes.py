"""Finding and stopping the processes a command started (Linux /proc).

`serve` and `worker` stop what they started by process group or by
descent, never by a list taken earlier: a process spawned meanwhile, or one
re-parented to init after its parent died, is found all the same.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator


def _living() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields after the command name) of every process that is not a zombie."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # the command name may hold spaces and parentheses: split after the last ')'
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                yield int(entry), fields


def in_group(pgid: int) -> list[int]:
    return [pid for pid, fields in _living() if int(fields[2]) == pgid]


def in_session(sid: int) -> list[int]:
    return [pid for pid, fields in _living() if int(fields[3]) == sid]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, fields in _living():
        children.setdefault(int(fields[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(find: Callable[[], list[int]], timeout: float = 5.0) -> None:
    """SIGKILL whatever `find()` names, again and again, until it names nothing."""
    deadline = time.monotonic() + timeout
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


_interrupted_early = False


def _interrupt(signum, frame) -> None:
    global _interrupted_early
    _interrupted_early = True
    signal.default_int_handler(signum, frame)


def record_early_interrupts() -> None:
    """From a command's first line: Ctrl-C still raises KeyboardInterrupt,
    and is remembered too. Python drops a KeyboardInterrupt raised inside an
    import's lock callback ("Exception ignored in ... cb"); the start-up
    would then go on as if never interrupted and serve for good."""
    signal.signal(signal.SIGINT, _interrupt)


class StopRequest:
    """Records SIGINT, SIGTERM and SIGHUP, whenever they come; the command
    polls it and stops in its own time. `listen()` again after a library
    installs handlers of its own. A Ctrl-C that came before, during the
    start-up, counts as a request."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.requested = _interrupted_early
        self.listen()

    def listen(self) -> None:
        for signum in self.SIGNALS:
            signal.signal(signum, self._request)

    def _request(self, signum, frame) -> None:
        self.requested = True


# Set when a worker command stops its cluster; the processes the cluster
# forked inherit it, so a long task (the delivery timer) ends its run at
# once instead of holding the stop for its grace period.
_cluster_stopping = None


def share_stop_with_forks():
    """In the worker command, before its cluster forks: the event that
    `cluster_stopping()` reads in every process forked afterwards."""
    global _cluster_stopping
    _cluster_stopping = multiprocessing.get_context("fork").Event()
    return _cluster_stopping


def cluster_stopping() -> bool:
    return _cluster_stopping is not None and _cluster_stopping.is_set()
