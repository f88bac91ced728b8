from django.apps import AppConfig


class CoordinationConfig(AppConfig):
    name = "coordination"
    verbose_name = "Tasks and collectives"
    schedules = [("sweep-claims", "coordination.tasks.sweep_claims", 1)]
