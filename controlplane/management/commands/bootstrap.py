import secrets

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApiError
from controlplane.models import Member
from controlplane.services import create_member


class Command(BaseCommand):
    help = "Create the first admin if there is none, printing its password once."

    def add_arguments(self, parser):
        parser.add_argument("--handle", default="admin")

    def handle(self, *args, handle, **options):
        if Member.objects.filter(is_admin=True).exists():
            return
        password = secrets.token_urlsafe(12)
        try:
            create_member(handle, kind=Member.Kind.HUMAN, is_admin=True, password=password, actor=None)
        except ApiError as exc:  # a malformed handle, or one a member who is no admin holds
            raise CommandError(f"{exc.message} (--handle {handle})") from None
        self.stdout.write(
            "\nFirst admin created (this password is shown only now):\n"
            f"  user:     {handle}\n  password: {password}\n"
            f"  web app:  {settings.SWITCHBOARD_PUBLIC_URL}/app/\n"
            f"  admin:    {settings.SWITCHBOARD_PUBLIC_URL}/admin/\n"
            f"  API token: .venv/bin/python manage.py issuecredential {handle}\n"
        )
