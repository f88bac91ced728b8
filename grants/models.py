"""Grants and approval requests (SPEC §5) live here."""
