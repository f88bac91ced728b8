import pytest

from tests.webhooks.receiver import serve_receiver


@pytest.fixture(scope="session")
def https_receiver(tmp_path_factory):
    receiver, ca, stop = serve_receiver(tmp_path_factory.mktemp("tls"))
    yield receiver, ca
    stop()


@pytest.fixture
def receiver(https_receiver, settings):
    """The HTTPS receiver on 127.0.0.1, trusted through WEBHOOK_CA_BUNDLE;
    loopback targets allowed (tests only)."""
    receiver, ca = https_receiver
    settings.WEBHOOK_CA_BUNDLE = str(ca)
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    receiver.requests.clear()
    receiver.respond = None
    yield receiver
    receiver.respond = None
