from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self):
        from controlplane.log import APPEND_HOOKS
        from webhooks.outbox import enqueue_wakes

        if enqueue_wakes not in APPEND_HOOKS:
            APPEND_HOOKS.append(enqueue_wakes)
