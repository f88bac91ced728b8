from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApiError
from controlplane.models import Member
from controlplane.bearer import issue_credential


class Command(BaseCommand):
    help = "Issue a bearer credential for a member and print the token (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("handle")

    def handle(self, *args, handle, **options):
        member = Member.objects.filter(handle=handle.removeprefix("@")).first()
        if member is None:
            raise CommandError(f"no member @{handle.removeprefix('@')}")
        try:
            _, token = issue_credential(member, actor=None)
        except ApiError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(token)
