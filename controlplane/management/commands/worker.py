"""The django-q2 worker cluster, stoppable at any moment.

`manage.py qcluster` installs its stop handler before its sentinel exists,
and a SIGTERM in that window is lost (the handler finds nothing to stop and
the sentinel starts anyway). Here a stop signal only records the request,
and the cluster is stopped as soon as it can be, however early it came.
A worker in the middle of a task gets STOP_GRACE_SECONDS to finish it, then
is killed: every task is safe to kill (webhook sends hold a lease and are
sent again, firewall and barrier steps are transactions). The delivery timer,
the one long task, hears of the stop (`cluster_stopping`) and ends its run
at once, recording what it had sent.
"""
from __future__ import annotations

import os
import threading
import time

from django.core.management.base import BaseCommand
from django.db import connections
from django_q.cluster import Cluster

from controlplane.processes import StopRequest, descendants, kill_all, share_stop_with_forks
from controlplane.schedules import Watcher, ensure_schedules

STOP_GRACE_SECONDS = 5


class Command(BaseCommand):
    help = "Run the django-q2 worker cluster (and create the schedules) until stopped."

    def handle(self, *args, **options):
        stop = StopRequest()
        ensure_schedules()
        # The cluster forks: no process may inherit an open database socket
        # (a pooled one included), or two would talk over it at once.
        for connection in connections.all():
            connection.close()
            if hasattr(connection, "close_pool"):
                connection.close_pool()
            _check_pooled_connections(connection)
        os.register_at_fork(after_in_child=forget_inherited_connections)
        stopping = share_stop_with_forks()
        cluster = Cluster()
        stop.listen()  # Cluster() put its own handlers in place
        if stop.requested:
            return
        cluster.start()
        watcher = Watcher()  # after the fork: the cluster's processes inherit none of its connections
        while not stop.requested and cluster.sentinel.is_alive():
            watcher.tick()
            time.sleep(0.1)
        for event in (stopping, cluster.stop_event):
            set_unless_held(event)
        cluster.sentinel.join(STOP_GRACE_SECONDS)
        kill_all(lambda: descendants(os.getpid()))
        cluster.sentinel.join()


def set_unless_held(event, seconds: float = STOP_GRACE_SECONDS) -> None:
    """Set a multiprocessing event the cluster's processes share, giving up
    after `seconds`: setting it takes a lock they share, which one killed
    while holding it (a stop signal sent to the whole process group, as
    service managers do) never releases, and the command hung for ever."""
    setter = threading.Thread(target=event.set, daemon=True)
    setter.start()
    setter.join(seconds)


def _check_pooled_connections(connection) -> None:
    """A task takes a pooled connection only after a round trip proves it
    alive (Django's CONN_HEALTH_CHECKS, which a pool runs at checkout).
    After a database restart every pooled connection is dead; a request
    that gets one fails and its client retries (503), but a task that does
    fails for nobody to see, and the timer, the sweeps and the scheduler went
    on failing, one dead connection after another, for minutes (found by the
    fault matrix). Servers skip the check: a round trip per request costs
    more than the retries."""
    connection.settings_dict["CONN_HEALTH_CHECKS"] = True


_inherited: list = []


def forget_inherited_connections() -> None:
    """In a process the cluster forks later (a worker reincarnated after it
    died): drop the connection pool and connections inherited from the
    parent, which had used the database meanwhile (its scheduler). The
    inherited pool has no threads in the child: every task waited out the
    pool's timeout and failed, for as long as the worker lived (found by the
    fault matrix). They are kept referenced, never closed: closing would end
    the parent's sessions."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited.append(dict(DatabaseWrapper._connection_pools))
    DatabaseWrapper._connection_pools.clear()
    for connection in connections.all(initialized_only=True):
        _inherited.append(connection.connection)
        connection.connection = None

