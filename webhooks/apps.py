import logging

from django.apps import AppConfig


def _resume_on_spawn(sender, proc_name, **kwargs):
    """A worker that starts picks up wakes a stopped one left (due, or
    claimed by a worker that died) without waiting for the minute sweep,
    as the timer if the one before died (webhooks.tasks.resume)."""
    from django_q.conf import Conf
    from django_q.tasks import async_task

    if Conf.SYNC:  # tasks run inline (tests): there is no worker to start
        return
    try:
        async_task("webhooks.tasks.resume")
    except Exception:  # the minute sweep covers it
        logging.getLogger(__name__).warning("could not queue webhook delivery at worker start", exc_info=True)


def _offer_on_reinstatement(sender, instance, update_fields=None, **kwargs):
    """A reinstated member's wakes and pushed items go on at once, not at
    the next minute's sweep: those that fell due while they were suspended
    waited (webhooks.due.sendable)."""
    if update_fields and "status" in update_fields and instance.status == instance.Status.ACTIVE:
        from webhooks.due import kick_on_commit
        from webhooks.mcp import offer_waiting

        offer_waiting(instance.pk)
        kick_on_commit()


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"
    schedules = [("deliver-webhooks", "webhooks.tasks.deliver", 1),
                 ("reap-deleted-webhooks", "webhooks.tasks.reap_deleted", 60)]
    gauges = "webhooks.health.gauges"  # manage.py health (controlplane.health)

    def ready(self):
        from django_q.signals import post_spawn

        post_spawn.connect(_resume_on_spawn, dispatch_uid="webhooks.resume_on_spawn")
        from django.db.models.signals import post_save

        from controlplane.models import Member

        post_save.connect(_offer_on_reinstatement, sender=Member, dispatch_uid="webhooks.offer_on_reinstatement")
        from controlplane.bearer import credential_revoked
        from webhooks.mcp import end_for_credential

        credential_revoked.connect(end_for_credential, dispatch_uid="webhooks.end_for_credential")
        from controlplane.log import register_append_hook
        from inbox.mailbox import register_acknowledged_hook
        from webhooks.outbox import acknowledged, enqueue_wakes, offer_to_joiners

        # Every appended event gets its wakes in its own transaction, and so
        # does every acknowledgement (which appends none) that changes a
        # pushed pending count; a member who joins, the pushes that waited.
        register_append_hook(enqueue_wakes)
        register_append_hook(offer_to_joiners)
        register_acknowledged_hook(acknowledged)
