from django.apps import AppConfig


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
