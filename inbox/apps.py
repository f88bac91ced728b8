from django.apps import AppConfig


def _settle_on_suspension(sender, instance, update_fields=None, **kwargs):
    """A suspended member answers nothing any more: the operations waiting
    for them fail after the commit, not at their deadline."""
    if update_fields and "status" in update_fields and instance.status != instance.Status.ACTIVE:
        from controlplane.live import kick_on_commit

        kick_on_commit("inbox.tasks.settle_owed_by", instance.pk)


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "Messages and inbox"
    schedules = [("classify-inbox-items", "inbox.tasks.classify_all", 1),
                 ("finish-collectives", "inbox.tasks.finish_collectives", 1)]
    gauges = "inbox.health.gauges"  # manage.py health (controlplane.health)

    def ready(self):
        from controlplane.services import register_removal_hook
        from inbox import collectives

        # Removals fail the collective operations that count on the member.
        register_removal_hook(collectives.fail_for_removed)
        from django.db.models.signals import post_save

        from controlplane.models import Member

        post_save.connect(_settle_on_suspension, sender=Member, dispatch_uid="inbox.settle_on_suspension")
