import json

from django.core.management.base import BaseCommand

from controlplane.health import gauges


class Command(BaseCommand):
    help = "Print the backlog figures to watch (docs/observability.md): queued tasks, due wakes, pending items."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON object (null: unknown)")

    def handle(self, *args, **options):
        figures = gauges()
        if options["json"]:
            self.stdout.write(json.dumps(figures))
            return
        width = max(map(len, figures), default=0)
        for name, value in figures.items():
            self.stdout.write(f"{name:<{width}}  {'unknown' if value is None else value}")
