from django.apps import AppConfig


class CoordinationConfig(AppConfig):
    name = "coordination"
    verbose_name = "Tasks and collectives"
    schedules = [("sweep-claims", "coordination.tasks.sweep_claims", 1)]

    def ready(self):
        from controlplane.services import space_unarchived, writer_lost
        from coordination.claims import look_again, look_at_claims_of

        space_unarchived.connect(look_again, dispatch_uid="coordination.look_again")
        writer_lost.connect(look_at_claims_of, dispatch_uid="coordination.look_at_claims_of")
