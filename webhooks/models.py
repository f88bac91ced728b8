"""Endpoints, subscriptions, deliveries and attempts (SPEC §8) live here."""
