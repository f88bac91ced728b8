"""Checking Switchboard's signed requests (SPEC §8, §9): the rules in one place.

    keys = fetch_signing_keys("https://switchboard.example")   # {key id: public key}
    verifier = WakeVerifier(keys, issuer="https://switchboard.example", secret=None)
    wake = verifier.verify(headers, raw_body)    # raises InvalidWake
    if verifier.first_time(wake["id"]):          # dedupe by delivery id
        persist(wake); respond 202; then read the feed from your own cursor

`verify` checks a native wake or challenge, in order: the Ed25519 signature
against the published key named by `Webhook-Key-Id` (fetching the keys
again when the id is new, at most once per `KEY_REFRESH_SECONDS`), the Standard Webhooks HMAC when a `whsec_` secret
is configured, the timestamp (at most `tolerance` seconds old or ahead), the
body's id against `Webhook-Id`, the issuer, and the envelope type.
`verify_standard` checks an MCP push: the HMAC alone, the timestamp, and the
body's `eventId` against `webhook-id`. `WakeReceiver` (receiver.py) builds
a whole receiver on these.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

CHALLENGE = "spaces.webhook.challenge"
WAKE_TYPES = ("spaces.events.available", "spaces.inbox_events.available", CHALLENGE)
MCP_VERIFICATION = "verification"
TOLERANCE_SECONDS = 300
# An unknown key id costs an outbound request on the anonymous rate limit; anyone can send one.
KEY_REFRESH_SECONDS = 60
KEY_FETCH_SECONDS = 10  # one try: an unknown key id is anyone's to send


class InvalidWake(Exception):
    """The request is not a valid wake; answer 400 (or 401) and drop it.
    `signature` is True when a signature was missing or wrong."""

    def __init__(self, reason: str, *, signature: bool = False):
        super().__init__(reason)
        self.reason, self.signature = reason, signature


class SigningKeysUnavailable(Exception):
    """The published keys could not be fetched, so the request could not be
    checked; answer 503 so that the server retries it later."""


def b64url_decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def keys_from_listing(listing: Mapping) -> dict[str, bytes]:
    """`{key_id: raw public key}` from a `GET /v0/webhook-signing-keys` answer."""
    return {k["key_id"]: b64url_decode(k["public_key"]) for k in listing["keys"] if k["algorithm"] == "ed25519"}


def fetch_signing_keys(base_url: str, *, opener: Callable[[str], bytes] | None = None) -> dict[str, bytes]:
    """The published keys, `{key_id: raw public key}`, from
    `GET {base_url}/v0/webhook-signing-keys` (`opener(url) -> bytes` to
    fetch it some other way)."""
    url = f"{base_url.rstrip('/')}/v0/webhook-signing-keys"
    if opener is None:
        import httpx

        response = httpx.get(url, timeout=KEY_FETCH_SECONDS)
        response.raise_for_status()
        return keys_from_listing(response.json())
    return keys_from_listing(json.loads(opener(url)))


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class WakeVerifier:
    def __init__(self, keys: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None = None, *,
                 issuer: str | None = None, secret: str | None = None, mcp_secret: str | list[str] | None = None,
                 tolerance: int = TOLERANCE_SECONDS, remember: int = 10_000, clock: Callable[[], float] = time.time):
        self._fetch = keys if callable(keys) else None
        self._keys = {} if callable(keys) or keys is None else dict(keys)  # fetched on the first wake
        self._issuer = issuer.rstrip("/") if issuer else None
        self._secret = _secret_bytes(secret) if secret else None
        mcp = [mcp_secret] if isinstance(mcp_secret, str) else list(mcp_secret or ())
        self._mcp_secrets = [_secret_bytes(s) for s in mcp]
        self.tolerance = tolerance
        self._clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self._refresh_lock = threading.Lock()
        self._refreshed_at: float | None = None  # when the keys were last fetched, or tried
        self._refresh_failed = False

    def _key(self, key_id: str) -> Ed25519PublicKey:
        keys = self._keys
        if key_id not in keys and self._fetch is not None:
            keys = self._refreshed_keys()  # a rotation: the new key is published before it signs
        if key_id not in keys:
            raise InvalidWake("unknown signing key", signature=True)
        return Ed25519PublicKey.from_public_bytes(keys[key_id])

    def _refreshed_keys(self) -> dict[str, bytes]:
        """The keys, fetched again unless they were fetched (or tried) less
        than `KEY_REFRESH_SECONDS` ago: until then an unknown id stays unknown.
        Raises `SigningKeysUnavailable` when the latest try failed."""
        with self._refresh_lock:  # concurrent unknown ids share one fetch
            now = self._clock()
            if self._refreshed_at is None or not 0 <= now - self._refreshed_at < KEY_REFRESH_SECONDS:
                try:
                    self._keys = dict(self._fetch())
                except Exception as failure:  # noqa: BLE001 - any failure to fetch is worth a retry
                    self._refresh_failed = True
                    raise SigningKeysUnavailable(f"{type(failure).__name__}: {failure}") from failure
                finally:  # the window counts from the fetch's end: those queued behind it fetch no more
                    self._refreshed_at = self._clock()
                self._refresh_failed = False
            elif self._refresh_failed:
                raise SigningKeysUnavailable("the latest fetch of the signing keys failed")
            return self._keys

    def _check_timestamp(self, timestamp: str) -> None:
        if not timestamp.isdigit() or abs(self._clock() - int(timestamp)) > self.tolerance:
            raise InvalidWake("stale or future timestamp")

    @staticmethod
    def _check_hmac(secrets: list[bytes], message_id: str, timestamp: str, body: bytes, entries: list[str]) -> None:
        macs = []
        for entry in entries:
            if entry.startswith("v1,"):
                try:
                    macs.append(base64.b64decode(entry[3:], validate=True))
                except (binascii.Error, ValueError):
                    continue
        signed = f"{message_id}.{timestamp}.".encode() + body
        for secret in secrets:
            expected = hmac.new(secret, signed, hashlib.sha256).digest()
            if any(hmac.compare_digest(expected, mac) for mac in macs):
                return
        raise InvalidWake("bad Standard Webhooks signature", signature=True)

    @staticmethod
    def _json(body: bytes) -> dict:
        try:
            parsed = json.loads(body)
        except ValueError:
            raise InvalidWake("body is not JSON") from None
        if not isinstance(parsed, dict):
            raise InvalidWake("body is not a JSON object")
        return parsed

    def verify(self, headers: Mapping[str, str], body: bytes) -> dict:
        """A native wake or challenge, once every check passes."""
        headers = _lower(headers)
        try:
            message_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
            key_id, signatures = headers["webhook-key-id"], headers["webhook-signature"].split()
        except KeyError as missing:
            raise InvalidWake(f"missing header {missing}", signature=True) from None
        ed25519 = [s[3:] for s in signatures if s.startswith("v1=")]
        if not ed25519:
            raise InvalidWake("no Ed25519 signature", signature=True)
        signed = f"{key_id}.{timestamp}.".encode() + body
        key = self._key(key_id)
        if not any(self._signs(key, signature, signed) for signature in ed25519):
            raise InvalidWake("bad signature", signature=True)
        if self._secret is not None:
            self._check_hmac([self._secret], message_id, timestamp, body, signatures)
        self._check_timestamp(timestamp)
        wake = self._json(body)
        if wake.get("id") != message_id:
            raise InvalidWake("body id differs from Webhook-Id")
        if wake.get("type") not in WAKE_TYPES:
            raise InvalidWake("unknown type")
        if self._issuer is not None and wake.get("type") != CHALLENGE and \
                str(wake.get("issuer", "")).rstrip("/") != self._issuer:
            raise InvalidWake("wrong issuer")
        return wake

    @staticmethod
    def _signs(key: Ed25519PublicKey, signature: str, signed: bytes) -> bool:
        """Whether `signature` (one `v1=` entry) is `key`'s over `signed`: any
        entry may be the one, as SPEC §8 has verifiers pick by prefix."""
        try:
            key.verify(b64url_decode(signature), signed)
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True

    def verify_standard(self, headers: Mapping[str, str], body: bytes) -> dict:
        """An MCP push (Standard Webhooks signed with the `mcp_secret` given
        to `events/subscribe`), once every check passes."""
        if not self._mcp_secrets:
            raise InvalidWake("no secret configured for Standard Webhooks requests", signature=True)
        headers = _lower(headers)
        try:
            message_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
            signatures = headers["webhook-signature"].split()
        except KeyError as missing:
            raise InvalidWake(f"missing header {missing}", signature=True) from None
        self._check_hmac(self._mcp_secrets, message_id, timestamp, body, signatures)
        self._check_timestamp(timestamp)
        event = self._json(body)
        if event.get("type") != MCP_VERIFICATION and event.get("eventId") != message_id:
            raise InvalidWake("body eventId differs from webhook-id")
        return event

    def first_time(self, delivery_id: str) -> bool:
        """True the first time an id is seen (retries repeat the id). In
        memory and bounded; `WakeReceiver` persists ids through a store."""
        if delivery_id in self._seen:
            self._seen.move_to_end(delivery_id)
            return False
        self._seen[delivery_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        return True
