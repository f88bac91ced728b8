import sys

from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApiError
from controlplane.models import Member
from controlplane.services import create_member


class Command(BaseCommand):
    help = "Create a member and print its id."

    def add_arguments(self, parser):
        parser.add_argument("handle")
        parser.add_argument("--kind", choices=Member.Kind.values, default=Member.Kind.HUMAN)
        parser.add_argument("--admin", action="store_true", help="an admin (Django staff and superuser)")
        parser.add_argument("--password-stdin", action="store_true", help="read the web password from stdin")
        parser.add_argument("--display-name", default="")

    def handle(self, *args, handle, kind, admin, password_stdin, display_name, **options):
        password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
        if password_stdin and not password:
            raise CommandError("no password on stdin")
        try:
            member = create_member(handle, kind=kind, display_name=display_name, is_admin=admin, password=password,
                                   actor=None)
        except ApiError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(member.public_id)
