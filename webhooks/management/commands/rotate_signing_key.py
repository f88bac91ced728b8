"""Retire the active webhook signing key and start signing with a new one."""
from django.core.management.base import BaseCommand

from webhooks import crypto


class Command(BaseCommand):
    help = ("Rotate the Ed25519 key that signs webhook wakes. The retired key stays listed at "
            "/v0/webhook-signing-keys while requests signed with it may still be verified.")

    def handle(self, *args, **options):
        key = crypto.rotate_signing_key()
        self.stdout.write(key.key_id)
