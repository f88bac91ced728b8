import importlib
import sys

from django.apps import AppConfig


def load_rest_framework_without_unused_extras() -> None:
    """Import Django REST framework's compatibility module with PyYAML and
    Pygments hidden. It imports both when they are installed, for renderers
    this project does not use (DRF's OpenAPI YAML, the browsable API): 2.7
    MiB of every process (docs/benchmarks.md, round sixteen). Both import as
    usual afterwards (the schema's YAML renderer uses PyYAML). Runs while the
    apps load, before any model imports the framework."""
    hidden = [name for name in ("yaml", "pygments") if name not in sys.modules]
    if "rest_framework.compat" in sys.modules or not hidden:
        return
    sys.modules.update(dict.fromkeys(hidden))  # None: `import` raises ImportError
    try:
        importlib.import_module("rest_framework.compat")
    finally:
        for name in hidden:
            del sys.modules[name]


load_rest_framework_without_unused_extras()


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Switchboard core"
    schedules = [
        # (name, task path, minutes between runs): see controlplane.schedules
        ("prune-event-log", "controlplane.tasks.prune_event_log", 60),
        ("purge-idempotency-records", "controlplane.tasks.purge_idempotency_records", 60),
        ("clear-expired-sessions", "controlplane.tasks.clear_expired_sessions", 60),
    ]
    # Each app's backlog figures for manage.py health: see controlplane.health.
    gauges = "controlplane.health.task_queue"

    def ready(self):
        from controlplane import checks, converters, tracing  # noqa: F401 (checks: registered on import)
        from controlplane.api import authentication

        authentication.watch_changes()

        converters.register()  # before any URLconf (HTTP or WebSocket) is built
        tracing.stamp_log_records()

