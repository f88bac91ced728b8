from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web app"

    def ready(self):
        from django.contrib.auth.signals import user_logged_out

        from web.sockets import end_live_sockets

        user_logged_out.connect(end_live_sockets, dispatch_uid="web.end_live_sockets")
