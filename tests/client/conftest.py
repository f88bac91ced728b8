"""Fixtures for the client package's tests: a real `manage.py serve` and
members with tokens."""
from __future__ import annotations

import pytest
from switchboard_client import Client

from tests.servers import member_token, serving


@pytest.fixture
def server():
    """`serve` (Daphne and a worker) on a free loopback port: its base URL."""
    with serving() as (base, _):
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
