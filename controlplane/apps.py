from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Switchboard core"

    def ready(self):
        from controlplane import converters
        from controlplane.api import schema  # noqa: F401  (registers OpenAPI extensions)

        converters.register()  # before any URLconf (HTTP or WebSocket) is built
