from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Switchboard core"
    schedules = [
        # (name, task path, minutes between runs): see controlplane.schedules
        ("prune-event-log", "controlplane.tasks.prune_event_log", 60),
        ("purge-idempotency-records", "controlplane.tasks.purge_idempotency_records", 60),
    ]
    # Each app's backlog figures for manage.py health: see controlplane.health.
    gauges = "controlplane.health.task_queue"

    def ready(self):
        from controlplane import converters, tracing
        from controlplane.api import authentication

        authentication.watch_changes()

        converters.register()  # before any URLconf (HTTP or WebSocket) is built
        tracing.stamp_log_records()

