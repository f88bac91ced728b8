"""Where wakes may go (SPEC §8): which webhook URLs are acceptable, and
which resolved addresses may be reached. webhooks.transport applies the
address rule to every name it resolves; endpoint creation applies the URL
rule. No HTTP client here: the web processes load only this."""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from django.conf import settings

from controlplane.errors import InvalidUrl

MAX_URL_CHARS = 2048
_UNPRINTABLE = re.compile(r"[\x00-\x20\x7f\s]")  # controls, spaces, and every other whitespace
# A host whose last label is a number is an IPv4 address to URL parsers and
# resolvers, in forms ipaddress does not read (2130706433, 0x7f000001,
# 0177.0.0.1, 127.1, 127.0.0.1.): only a.b.c.d is taken.
_NUMERIC_LAST_LABEL = re.compile(r"(?:^|\.)(?:0x[0-9a-f]*|[0-9]+)\.?$", re.IGNORECASE)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Not globally reachable (IANA's special-purpose registries), though
# Python 3.11's tables call them global: the IETF protocol assignments but
# their two anycast services, the retired 6to4 relay, NAT64's local-use
# prefix, IPv6's newer documentation range and SRv6's SIDs.
NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in (
    "192.0.0.0/24", "192.88.99.0/24", "64:ff9b:1::/48", "3fff::/20", "5f00::/16"))
GLOBAL_ANYCAST = {ipaddress.ip_address("192.0.0.9"), ipaddress.ip_address("192.0.0.10")}
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
            ipaddress.ip_address("100.100.100.200")}


class ForbiddenDestination(OSError):
    """A name resolved to (or a URL names) an address wakes may not reach."""


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if address in NAT64 or (int(address) >> 32 == 0 and int(address) > 1):  # NAT64, IPv4-compatible ::a.b.c.d
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def forbidden_reason(address: ipaddress.IPv4Address | ipaddress.IPv6Address, *, allow_loopback: bool) -> str | None:
    """Why `address` may not be reached, or None when it may."""
    if address.version == 6:
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return forbidden_reason(embedded, allow_loopback=allow_loopback)
    if address.is_loopback:
        return None if allow_loopback else "loopback"
    for reason, hit in (
        ("metadata", address in METADATA),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("site-local", address.version == 6 and address.is_site_local),  # deprecated, not global to Python 3.11
        ("multicast", address.is_multicast),
        ("cgnat", address.version == 4 and address in CGNAT),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("not-global", not address.is_global or (address not in GLOBAL_ANYCAST
                                                 and any(address in network for network in NOT_GLOBAL))),
    ):
        if hit:
            return reason
    return None


def check_address(host: str) -> None:
    """Raise ForbiddenDestination unless `host` (an IP literal) may be reached."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    reason = forbidden_reason(address, allow_loopback=settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS)
    if reason:
        raise ForbiddenDestination(f"{reason} address")


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def validate_url(url: str) -> str:
    """422 INVALID_URL unless `url` is an acceptable target: HTTPS (plain
    HTTP only with WEBHOOK_ALLOW_PRIVATE_NETWORKS), an ASCII host, no
    credentials, no fragment, and no forbidden IP literal. Names are checked when used."""
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS or _UNPRINTABLE.search(url):
        raise InvalidUrl(f"A webhook URL is printable characters without spaces, at most {MAX_URL_CHARS} of them.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidUrl("The URL cannot be parsed.") from None
    schemes = ("https", "http") if settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS else ("https",)
    if parts.scheme not in schemes:
        raise InvalidUrl("Webhook URLs must use https.", details={"scheme": parts.scheme})
    if not parts.hostname:
        raise InvalidUrl("The URL has no host.")
    if not parts.hostname.isascii():  # the HTTP client maps it through IDNA: "１２７.０.０.１" is 127.0.0.1 to it
        raise InvalidUrl("The URL's host must be ASCII: write an internationalized name in its xn-- form.",
                         details={"reason": "non_ascii_host"})
    if parts.username is not None or parts.password is not None:
        raise InvalidUrl("Credentials do not belong in a webhook URL; use a whsec_ secret.")
    if parts.fragment or "#" in url:
        raise InvalidUrl("The URL must not have a fragment.")
    if port == 0:
        raise InvalidUrl("The URL's port must be 1–65535.")
    if _NUMERIC_LAST_LABEL.search(parts.hostname) and not _ip_literal(parts.hostname):
        raise InvalidUrl("The URL's host is a number in a form other than a.b.c.d: write the address so.",
                         details={"reason": "numeric_host"})
    if _ip_literal(parts.hostname):
        try:
            check_address(parts.hostname)
        except ForbiddenDestination as exc:
            raise InvalidUrl(f"The URL names a {exc}.", details={"reason": "forbidden_destination"}) from None
    return url
