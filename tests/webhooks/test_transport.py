"""Transport safety: forbidden destinations are refused before any
connection is attempted. Names are mapped to forbidden addresses by an
injected resolver; no traffic leaves loopback."""
import asyncio
import ipaddress
import socket
import time

import pytest
from aiohttp.abc import AbstractResolver

from controlplane.errors import InvalidUrl
from webhooks.destinations import forbidden_reason, validate_url
from webhooks import engine, transport
from webhooks.transport import Transport

FORBIDDEN = [
    "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "100.127.255.254",
    "169.254.169.254", "169.254.1.1", "0.0.0.0", "0.1.2.3", "224.0.0.1", "239.255.255.250", "240.0.0.1",
    "255.255.255.255", "192.0.2.1", "198.18.0.1", "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254",
    "ff02::1", "::ffff:10.0.0.1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a00:1",
    "2002:a00:1::1", "2002:7f00:1::1", "::a00:1", "2001:db8::1", "100.100.100.200", "fec0::1",
    # not global, though Python 3.11's tables call them so
    "192.0.0.8", "192.88.99.1", "64:ff9b:1::a00:1", "3fff::1", "5f00::1",
]


class MappedResolver(AbstractResolver):
    """Resolves every name to the given addresses."""

    def __init__(self, *addresses):
        self.addresses = addresses
        self.asked = []

    async def resolve(self, host, port=0, family=socket.AF_INET):
        self.asked.append(host)
        return [{"hostname": host, "host": a, "port": port,
                 "family": socket.AF_INET6 if ":" in a else socket.AF_INET, "proto": 0, "flags": 0}
                for a in self.addresses]

    async def close(self):
        pass


@pytest.fixture
def no_connections(monkeypatch):
    """Fails the test if anything tries to open a connection."""
    attempts = []

    async def refuse(self, *args, **kwargs):
        attempts.append(args)
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_connection", refuse)
    monkeypatch.setattr(asyncio.BaseEventLoop, "sock_connect", refuse)
    return attempts


def post(url, resolver):
    async def go():
        async with Transport(resolver=resolver) as transport:
            return await transport.post(url, b"{}", {"Content-Type": "application/json"})
    return asyncio.run(go())


@pytest.mark.parametrize("address", FORBIDDEN)
def test_names_resolving_to_forbidden_addresses_are_refused_before_connecting(address, no_connections, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    resolver = MappedResolver(address)
    outcome = post("https://receiver.example/hook", resolver)
    assert outcome.error_class == "forbidden_destination" and outcome.status_code is None
    assert resolver.asked == ["receiver.example"] and no_connections == []


def test_one_forbidden_address_among_public_ones_refuses_the_name(no_connections, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    outcome = post("https://receiver.example/hook", MappedResolver("203.0.113.10", "8.8.8.8", "10.0.0.1"))
    assert outcome.error_class == "forbidden_destination" and no_connections == []


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", "::ffff:192.168.0.1", "100.64.0.1"])
def test_the_development_flag_admits_loopback_only(address, no_connections, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    outcome = post("https://receiver.example/hook", MappedResolver(address))
    assert outcome.error_class == "forbidden_destination" and no_connections == []


@pytest.mark.parametrize("url, error", [
    ("https://10.0.0.1/x", "forbidden_destination"), ("https://[::1]/x", "forbidden_destination"),
    ("https://169.254.169.254/x", "forbidden_destination"), ("https://[::ffff:7f00:1]/x", "forbidden_destination"),
    ("http://8.8.8.8/x", "invalid_url"),
])
def test_ip_literals_and_schemes_are_checked_before_connecting(url, error, no_connections, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    resolver = MappedResolver("8.8.8.8")
    outcome = post(url, resolver)
    assert outcome.error_class == error and no_connections == [] and resolver.asked == []


@pytest.mark.parametrize("host", ["１２７.０.０.１", "127。0。0。1", "①②⑦.0.0.1", "１６９.２５４.１６９.２５４",
                                  "bücher.example"])
def test_a_host_not_spelled_in_ascii_is_refused_before_connecting(host, no_connections, settings):
    # the HTTP client maps such a host through IDNA: full-width digits and
    # ideographic dots become an IP literal it connects to without resolving
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    resolver = MappedResolver("8.8.8.8")
    with pytest.raises(InvalidUrl) as refused:
        validate_url(f"https://{host}:8443/hook")
    assert refused.value.details == {"reason": "non_ascii_host"}
    outcome = post(f"https://{host}:8443/hook", resolver)
    assert outcome.error_class == "invalid_url" and no_connections == [] and resolver.asked == []
    assert validate_url("https://xn--bcher-kva.example/hook") == "https://xn--bcher-kva.example/hook"


def test_every_name_is_resolved_again_on_each_connection(receiver):
    # a name that first resolves to the loopback receiver, then to a private address
    class Rebinding(MappedResolver):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            self.addresses = ("127.0.0.1",) if not self.asked else ("10.0.0.1",)
            return await super().resolve(host, port, family)

    resolver = Rebinding()
    receiver.respond = lambda received: (202, {"Connection": "close"}, b"{}")  # no connection to reuse

    async def twice():
        async with Transport(resolver=resolver) as transport:
            return await transport.post(receiver.url(), b"{}", {}), await transport.post(receiver.url(), b"{}", {})

    first, second = asyncio.run(twice())
    assert first.status_code == 202 and second.error_class == "forbidden_destination"
    assert resolver.asked == ["localhost", "localhost"]


@pytest.fixture
def silent_name_servers(monkeypatch):
    """Names other than the hosts file's are asked of a server on loopback
    that never answers; a thread-based lookup would sleep as long."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    monkeypatch.setattr(transport, "NAMESERVERS", [f"127.0.0.1:{server.getsockname()[1]}"], raising=False)
    system_lookup = socket.getaddrinfo

    def stalled(host, *args, **kwargs):
        if str(host).startswith("stalled"):
            time.sleep(transport.TOTAL_TIMEOUT + 5)
            raise socket.gaierror(socket.EAI_AGAIN, "no answer")
        return system_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    yield
    server.close()


def test_names_that_are_never_answered_hold_up_no_other_lookup(receiver, silent_name_servers):
    # given: as many lookups of unanswered names as one member's endpoints may have in flight
    async def go():
        async with Transport() as client:  # the system resolver
            stalled = [asyncio.create_task(client.post(f"https://stalled{n}.example/h", b"{}", {}))
                       for n in range(3 * engine.PER_ENDPOINT * 4)]
            await asyncio.sleep(0.2)
            # when: another endpoint's wake goes out
            started = time.monotonic()
            other = await client.post(receiver.url(), b"{}", {"Content-Type": "application/json"})
            took = time.monotonic() - started
            return other, took, await asyncio.gather(*stalled)

    other, took, stalled = asyncio.run(go())
    # then: it is answered at once; the others fail within the connect timeout
    assert other.status_code == 202 and took < 1.0
    assert {outcome.error_class for outcome in stalled} <= {"dns_error", "timeout"}
    assert max(outcome.duration_ms for outcome in stalled) < transport.CONNECT_TIMEOUT * 1000 + 1000


def test_a_verification_of_an_unanswered_name_ends_within_the_connect_timeout(silent_name_servers, as_alice):
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": "https://stalled.example/h"}).json()["endpoint"]
    started = time.monotonic()
    answer = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    assert answer.status_code == 422
    assert time.monotonic() - started < transport.CONNECT_TIMEOUT + 1


def test_tls_checks_the_hostname_not_the_address(receiver):
    # the receiver's certificate names localhost and 127.0.0.1; reached as
    # another name mapped to 127.0.0.1, verification must fail
    outcome = post(receiver.url(host="receiver.example"), MappedResolver("127.0.0.1"))
    assert outcome.status_code is None and outcome.error_class == "tls_error"
    assert post(receiver.url(), MappedResolver("127.0.0.1")).status_code == 202


def test_responses_are_read_up_to_a_bound(receiver):
    receiver.respond = lambda received: (200, {}, b"x" * 1_000_000)
    outcome = post(receiver.url(), MappedResolver("127.0.0.1"))
    assert outcome.status_code == 200 and len(outcome.body) == 64 * 1024


def test_global_addresses_are_allowed():
    for address in ("8.8.8.8", "203.0.114.1", "2606:4700:4700::1111", "192.0.0.9", "192.0.0.10"):
        assert forbidden_reason(ipaddress.ip_address(address), allow_loopback=False) is None


def test_validate_url_accepts_https_names(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    assert validate_url("https://hooks.example.com:8443/a?b=c") == "https://hooks.example.com:8443/a?b=c"
