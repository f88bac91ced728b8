"""Lock order between a group commit and an acknowledgement (PostgreSQL):
a group of sends takes its recipients' mailbox rows in member order, as
every other writer does, so neither waits for the other in a cycle."""
from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from controlplane import services
from inbox import writes
from inbox.models import Mailbox, Message
from inbox.services import send_message

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Captured(Exception):
    pass


def test_a_group_sending_to_two_members_waits_for_an_acknowledgement_holding_both_in_order(monkeypatch):
    # given: two members with mailboxes (low before high), and two direct sends to them,
    # high's first, captured as one group before they run
    owner = services.create_member("owner", actor=None)
    low, high = (services.create_member(h, actor=None) for h in ("low", "high"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=owner)
    for member in (low, high):
        services.join_space(space, actor=member)
    to_low, _ = services.get_or_create_direct(space, low, actor=owner)
    to_high, _ = services.get_or_create_direct(space, high, actor=owner)
    send_message(to_low, body="first", actor=owner)
    send_message(to_high, body="first", actor=owner)
    group = []

    def capture(write):
        group.append(write)
        raise Captured()

    monkeypatch.setattr(writes._group_commit, "write", capture)
    for conversation in (to_high, to_low):
        with pytest.raises(Captured):
            send_message(conversation, body="grouped", actor=owner)
    monkeypatch.undo()
    # when: an acknowledgement's transaction holds low's mailbox (taken first, in
    # member order) while the group starts, then takes high's
    params = connection.get_connection_params()
    other = psycopg.connect(host=params.get("host"), port=params.get("port"), user=params.get("user"),
                            dbname=params["dbname"])
    table = Mailbox._meta.db_table
    other.execute(f"SELECT 1 FROM {table} WHERE member_id = %s FOR UPDATE", [low.pk])
    results = []

    def commit_group():
        try:
            results.append(writes._commit_group(group))
        finally:
            connection.close()

    committing = threading.Thread(target=commit_group)
    committing.start()
    committing.join(1.5)  # past PostgreSQL's deadlock_timeout (1 s): a cycle would be broken by now
    other.execute(f"SELECT 1 FROM {table} WHERE member_id = %s FOR UPDATE", [high.pk])
    other.commit()
    other.close()
    committing.join(10)
    # then: the acknowledgement got both rows, and the group committed whole
    assert len(results) == 1 and len(results[0]) == 2
    assert Message.objects.filter(body="grouped").count() == 2
