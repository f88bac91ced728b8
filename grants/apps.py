import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


def _recover_on_spawn(sender, proc_name, **kwargs):
    """A django-q2 worker finishes persisted barriers before it takes work."""
    from grants import barrier
    try:
        barrier.recover()
    except Exception:  # never keep a worker from starting; the sweep retries within a minute
        log.exception("recovering revocation barriers at worker start failed")


class GrantsConfig(AppConfig):
    name = "grants"
    verbose_name = "Grants and approvals"

    def ready(self):
        from django_q.signals import post_spawn
        post_spawn.connect(_recover_on_spawn, dispatch_uid="grants.recover_on_spawn")
