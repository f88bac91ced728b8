"""Fixtures for the client package's tests: a real `manage.py serve` and
members with tokens."""
from __future__ import annotations

import pytest
from switchboard_client import Client

from tests.servers import member_token, serving


@pytest.fixture(scope="package")
def server(django_db_setup):
    """`serve` on a free loopback port, one for the package: its base URL.
    The tests share it as they share the test database, each with data of
    its own (emptied after every test). No worker: what the client calls
    needs none, and a worker of its own would take the deliveries of the
    servers other tests start beside it (with other webhook settings)."""
    with serving("--no-worker") as (base, _):
        yield base


@pytest.fixture
def clients(server):
    """Clients for alice (an admin) and bob, who share the open space `lab`
    with its channel #general."""
    alice = Client(server, member_token("alice", admin=True))
    bob = Client(server, member_token("bob"))
    alice.create_space("lab", "Lab")
    bob.join_space("lab")
    alice.create_channel("lab", "general")
    yield alice, bob
    alice.close()
    bob.close()
