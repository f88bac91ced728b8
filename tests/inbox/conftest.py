import pytest

from controlplane import services


@pytest.fixture
def group(space, alice, bob, carol):
    """alice's group conversation with bob and carol, in the open space."""
    conversation, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    return conversation


@pytest.fixture
def private_direct(alice, bob):
    """A private space of alice's with bob in it, and their direct conversation."""
    space = services.create_space(slug="priv", name="Priv", visibility="private", send_policy="open", actor=alice)
    services.add_member(space, bob, actor=alice)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    return space, direct
