"""normalize_host: plain HTTP for loopback hosts only, whatever their spelling."""
import pytest
from switchboard_client.config import normalize_host


@pytest.mark.parametrize(("given", "expected"), [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("localhost:8000", "http://localhost:8000"),
    ("localhost", "http://localhost"),
    ("[::1]:8000", "http://[::1]:8000"),
    ("[::1]", "http://[::1]"),
    ("LocalHost:8000/", "http://LocalHost:8000"),
    ("example.org", "https://example.org"),
    ("example.org:8443", "https://example.org:8443"),
    ("localhost.example.org", "https://localhost.example.org"),
    ("[2001:db8::1]:8000", "https://[2001:db8::1]:8000"),
    ("[::1", "https://[::1"),
    ("http://example.org/", "http://example.org"),
    ("https://127.0.0.1:8000", "https://127.0.0.1:8000"),
])
def test_loopback_hosts_default_to_http_and_the_rest_to_https(given, expected):
    assert normalize_host(given) == expected
