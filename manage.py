#!/usr/bin/env python
"""Django's command-line utility for Switchboard."""
import os
import sys


def main():
    from controlplane.processes import record_early_interrupts

    record_early_interrupts()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from controlplane.keys import MissingAdminKey

    try:
        execute_from_command_line(sys.argv)
    except (MissingAdminKey, ImproperlyConfigured) as error:  # a setting to fix: one line that says which
        sys.exit(f"manage.py: {error}")


if __name__ == "__main__":
    main()
