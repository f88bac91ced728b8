"""Credentials issued at once (PostgreSQL: real concurrent transactions)."""
import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from controlplane import services
from controlplane.models import Credential

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_requests_for_the_last_place_get_one_credential_between_them(monkeypatch, settings):
    # given a member one credential short of the cap
    settings.CREDENTIALS_PER_HOUR = 0  # the cap is under test, not the hourly limit
    alice = services.create_member("alice", actor=None)
    _, token = services.issue_credential(alice, actor=None)
    for _ in range(services.MAX_CREDENTIALS - 2):
        services.issue_credential(alice, actor=None)
    # and two requests that meet once each has counted (unless one waits for the other, which breaks the meeting)
    both_counted, create = threading.Barrier(2), Credential.objects.create

    def meeting_then_create(**fields):
        try:
            both_counted.wait(3)
        except threading.BrokenBarrierError:
            pass
        return create(**fields)

    monkeypatch.setattr(Credential.objects, "create", meeting_then_create)
    statuses = []

    def issue():
        try:
            statuses.append(APIClient().post("/v0/me/credentials", {}, format="json",
                                             HTTP_AUTHORIZATION=f"Bearer {token}").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # then one gets the last place and the other is told the cap
    assert sorted(statuses) == [201, 409]
    assert Credential.objects.filter(member=alice).count() == services.MAX_CREDENTIALS
