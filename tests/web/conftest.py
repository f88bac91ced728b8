"""Web app fixtures: human members who sign in with a password."""
import pytest
from django.test import Client

from controlplane import services
from controlplane.models import Member

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
