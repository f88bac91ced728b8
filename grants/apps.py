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
    schedules = [("expire-grants", "grants.tasks.expire_and_recover", 1)]
    watch = "grants.barrier.fence_expired"  # within a second of the expiry (controlplane.schedules)

    def ready(self):
        from django_q.signals import post_spawn

        from grants.authorization import GrantPolicy
        from inbox import authority

        post_spawn.connect(_recover_on_spawn, dispatch_uid="grants.recover_on_spawn")
        # Sends in explicit_only spaces ask this policy (see inbox.authority).
        authority.register(GrantPolicy())
