from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web app"

    def ready(self):
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_save, pre_save

        from controlplane.sessions import session_deleted
        from web.sockets import end_live_sockets, note_session_change, reconnect_live_sockets, recheck_live_sockets

        user_logged_out.connect(end_live_sockets, dispatch_uid="web.end_live_sockets")
        session_deleted.connect(reconnect_live_sockets, dispatch_uid="web.reconnect_live_sockets")
        user = get_user_model()
        pre_save.connect(note_session_change, sender=user, dispatch_uid="web.note_session_change")
        post_save.connect(recheck_live_sockets, sender=user, dispatch_uid="web.recheck_live_sockets")
