from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "Messages and inbox"
    schedules = [("classify-inbox-items", "inbox.tasks.classify_all", 1)]
