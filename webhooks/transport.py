"""The outbound HTTP transport for wakes and challenges (SPEC §8).

- The host is resolved on every connection (no DNS cache), on the event
  loop (c-ares: no thread a stalled name could hold), and every
  address it resolves to is checked: loopback, private, link-local, CGNAT,
  multicast, reserved, unspecified and cloud-metadata addresses are refused,
  for IPv4 and IPv6, including IPv4 embedded in IPv6 (mapped, compatible,
  6to4, Teredo, NAT64). One bad address refuses the whole name, so a
  resolver cannot slip one past by ordering.
- The connection goes to the checked address, while TLS keeps the
  hostname for SNI and certificate verification (aiohttp connects to the
  resolved `host` with `server_hostname` set to the URL's host).
- Redirects are never followed; connect and read timeouts and the response
  size are bounded.
- `WEBHOOK_ALLOW_PRIVATE_NETWORKS` (development and tests only) admits
  loopback addresses and plain `http://`; nothing else.

Which URLs and addresses are acceptable is webhooks.destinations' rule
(without aiohttp, so the web processes that only check URLs do not load it).

Callers hold no database transaction or lock while a request is in flight.
"""
from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import time
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import AsyncResolver
from django.conf import settings

from controlplane.clock import timestamp
from controlplane.errors import InvalidUrl
from webhooks.destinations import ForbiddenDestination, check_address, validate_url

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 10.0
TOTAL_TIMEOUT = 15.0
MAX_RESPONSE_BYTES = 64 * 1024
# Where names are looked up: None for the system's name servers
# (resolv.conf); tests point it at a silent socket on loopback.
NAMESERVERS: list[str] | None = None
RESOLVE_TIMEOUT, RESOLVE_TRIES = 2.0, 2  # inside CONNECT_TIMEOUT


def system_resolver() -> AbstractResolver:
    """The hosts file and the name servers, through c-ares on the event
    loop. A name whose servers never answer costs a socket and a timer until
    its timeout, not a thread: a pool of lookup threads shared by every
    endpoint was filled by one member's unanswered names, and everyone
    else's lookups queued behind them."""
    return AsyncResolver(nameservers=NAMESERVERS, timeout=RESOLVE_TIMEOUT, tries=RESOLVE_TRIES)


class GuardedResolver(AbstractResolver):
    """Resolves through `inner` (the system resolver unless one is injected)
    and refuses names with any forbidden address."""

    def __init__(self, inner: AbstractResolver | None = None):
        self.inner = inner  # the system's is made on the event loop that uses it

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        if self.inner is None:
            self.inner = system_resolver()
        results = await self.inner.resolve(host, port, family)
        if not results:
            raise ForbiddenDestination("the name resolved to nothing")
        for result in results:
            check_address(result["host"])
        return results

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


def ssl_context() -> ssl.SSLContext:
    """System CAs plus WEBHOOK_CA_BUNDLE; built once per process and bundle
    (loading the system store takes tens of milliseconds)."""
    return _ssl_context(settings.WEBHOOK_CA_BUNDLE)


@functools.lru_cache(maxsize=4)
def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_bundle:
        context.load_verify_locations(cafile=ca_bundle)
    return context


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error_class: str | None
    duration_ms: int
    retry_after: float | None = None
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - timestamp())
        except (TypeError, ValueError):
            return None


def error_class(exc: BaseException) -> str:
    """A short, secret-free name for what went wrong."""
    seen, current = set(), exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ForbiddenDestination):
            return "forbidden_destination"
        current = getattr(current, "os_error", None) or current.__cause__ or current.__context__
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return "tls_error"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns_error"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return "connection_closed"
    if isinstance(exc, InvalidUrl):
        return "invalid_url"
    return "request_error"


class Transport:
    """One aiohttp session for many concurrent requests. Use as an async
    context manager; `resolver` is injectable (tests map names to any address)."""

    def __init__(self, *, resolver: AbstractResolver | None = None, limit: int = 100):
        self._resolver = GuardedResolver(resolver)
        self._limit = limit
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Transport":
        connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False, ssl=ssl_context(),
                                         limit=self._limit, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=TOTAL_TIMEOUT, connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
        # Answers are read as sent, at most MAX_RESPONSE_BYTES, never
        # inflated: ask for them so (aiohttp offered gzip, and a receiver
        # that compressed its challenge answer failed as `not_json`).
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                             skip_auto_headers=("User-Agent",),
                                             headers={"User-Agent": "Switchboard-Webhooks/1",
                                                      "Accept-Encoding": "identity"})
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self._resolver.close()  # the connector closes only a resolver of its own

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        started = time.monotonic()

        def elapsed() -> int:
            return int((time.monotonic() - started) * 1000)

        try:
            validate_url(url)
            async with self.session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                content = b""
                async for chunk in response.content.iter_chunked(16 * 1024):
                    content += chunk[:MAX_RESPONSE_BYTES - len(content)]
                    if len(content) >= MAX_RESPONSE_BYTES:
                        break  # the rest is never read; the connection is dropped
                return Outcome(response.status, None, elapsed(), _retry_after(response.headers.get("Retry-After")),
                               content)
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome, classified without secrets
            return Outcome(None, error_class(exc), elapsed())
