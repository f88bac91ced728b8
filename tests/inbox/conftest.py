import pytest

from controlplane import services


@pytest.fixture
def group(space, alice, bob, carol):
    """alice's group conversation with bob and carol, in the open space."""
    conversation, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    return conversation
