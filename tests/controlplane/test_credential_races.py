"""Credentials issued at once (PostgreSQL: real concurrent transactions)."""
import pytest
from rest_framework.test import APIClient

from controlplane import bearer, services
from controlplane.models import Credential
from tests.conftest import at_once, meeting_point

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_requests_for_the_last_place_get_one_credential_between_them(monkeypatch, settings):
    # given a member one credential short of the cap
    settings.CREDENTIALS_PER_HOUR = 0  # the cap is under test, not the hourly limit
    alice = services.create_member("alice", actor=None)
    _, token = bearer.issue_credential(alice, actor=None)
    for _ in range(bearer.MAX_CREDENTIALS - 2):
        bearer.issue_credential(alice, actor=None)
    # and two requests that meet once each has counted (unless one waits for the other, which breaks the meeting)
    both_counted, create = meeting_point(), Credential.objects.create

    def meeting_then_create(**fields):
        both_counted()
        return create(**fields)

    monkeypatch.setattr(Credential.objects, "create", meeting_then_create)

    def issue():
        return APIClient().post("/v0/me/credentials", {}, format="json",
                                HTTP_AUTHORIZATION=f"Bearer {token}").status_code

    statuses = at_once(issue, issue)
    # then one gets the last place and the other is told the cap
    assert sorted(statuses) == [201, 409]
    assert Credential.objects.filter(member=alice).count() == bearer.MAX_CREDENTIALS
