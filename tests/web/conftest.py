"""Web app fixtures: human members who sign in with a password, and live sockets ended with their test."""
import asyncio

import pytest
import pytest_asyncio
from django.test import Client

from controlplane import services
from controlplane.live import log_watcher
from controlplane.models import Member
from tests.web.sockets import OPEN, stops_finished
from web.streams import streams

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Password hashing is deliberately slow; these tests sign in a lot."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def human(make_member):
    def make(handle: str, **kwargs) -> Member:
        return make_member(handle, kind=Member.Kind.HUMAN, password=PASSWORD, **kwargs)
    return make


@pytest.fixture
def ann(human):
    return human("ann")


@pytest.fixture
def ben(human):
    return human("ben")


@pytest.fixture
def browser_of():
    """A Django test client signed in as `member` (through the session, as a browser is)."""
    def make(member: Member) -> Client:
        client = Client()
        client.force_login(member.user)
        return client
    return make


@pytest.fixture
def room(ann, ben):
    """A private space owned by ann with ben as a member, and its #general."""
    space = services.create_space(slug="room", name="Room", visibility="private", send_policy="open", actor=ann)
    services.add_member(space, ben, actor=ann)
    channel = services.create_channel(space, "general", actor=ann)
    return space, channel


@pytest_asyncio.fixture
async def live_sockets(settings):
    """No periodic re-reads: every frame must come from a nudge (or the
    connect-time read). Every socket's application instance ends with its
    test, a refused or server-closed one too, and so does the log watcher."""
    settings.FEED_RECHECK_SECONDS = 30
    yield
    while OPEN:
        await OPEN.pop().disconnect()
    await stops_finished()  # receives that lost a cancellation stop before the loop ends
    for _ in range(500):  # and their streams end, so no read is left running
        if not streams.running():
            break
        await asyncio.sleep(0.01)
    assert not streams.running()
    await log_watcher.stop()  # started on this test's loop: it leaves the log group and stops with it
