from django.apps import AppConfig


class GrantsConfig(AppConfig):
    name = "grants"
    verbose_name = "Grants and approvals"
