from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "Messages and inbox"
