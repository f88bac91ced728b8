import pytest

from controlplane import services
from grants import services as grants


@pytest.fixture
def locked(alice, bob, carol):
    """An explicit_only space owned by alice, with bob and carol as members."""
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    return space


@pytest.fixture
def bob_to_carol(locked, bob, carol):
    """bob's direct conversation with carol in the explicit_only space."""
    conversation, _ = services.get_or_create_direct(locked, carol, actor=bob)
    return conversation


@pytest.fixture
def root(make_member):
    return make_member("root", kind="human", is_admin=True, password="root-pass-123")


@pytest.fixture
def as_root(api_for, root):
    return api_for(root)


@pytest.fixture
def grant(locked, alice):
    """Make a grant in the explicit_only space, as its owner alice."""
    def make(grant_id, kind, **fields):
        return grants.create_grant(locked, grant_id=grant_id, kind=kind, actor=alice, **fields)[0]

    return make


def send_path(conversation) -> str:
    return f"/v0/spaces/{conversation.space.slug}/conversations/{conversation.public_id}/messages"
