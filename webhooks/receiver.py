"""A small helper for receivers of Switchboard wakes (no Django needed).

    keys = fetch_signing_keys("https://switchboard.example")   # {key id: public key}
    verifier = WakeVerifier(keys, issuer="https://switchboard.example", secret=None)
    wake = verifier.verify(headers, raw_body)    # raises InvalidWake
    if verifier.first_time(wake["id"]):          # dedupe by delivery id
        persist(wake); respond 202; then read the feed from your own cursor

It checks, in order: the Ed25519 signature against the published key named
by `Webhook-Key-Id` (refreshing the keys once when the id is new), the
Standard Webhooks HMAC when you configured a `whsec_` secret, the timestamp
(at most `tolerance` seconds old or ahead), the body's id against
`Webhook-Id`, the issuer, and the envelope type.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

WAKE_TYPES = ("spaces.events.available", "spaces.inbox_events.available", "spaces.webhook.challenge")
TOLERANCE_SECONDS = 300


class InvalidWake(Exception):
    """The request is not a valid wake; answer 400 (or 401) and drop it."""


def _b64url_decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def fetch_signing_keys(base_url: str, *, opener: Callable | None = None) -> dict[str, bytes]:
    """The published keys, `{key_id: raw public key}`, from
    `GET {base_url}/v0/webhook-signing-keys`."""
    opener = opener or (lambda url: urllib.request.urlopen(url, timeout=10).read())
    listing = json.loads(opener(f"{base_url.rstrip('/')}/v0/webhook-signing-keys"))
    return {k["key_id"]: _b64url_decode(k["public_key"]) for k in listing["keys"] if k["algorithm"] == "ed25519"}


class WakeVerifier:
    def __init__(self, keys: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]], *, issuer: str | None = None,
                 secret: str | None = None, tolerance: int = TOLERANCE_SECONDS, remember: int = 10_000,
                 clock: Callable[[], float] = time.time):
        self._fetch = keys if callable(keys) else None
        self._keys = {} if callable(keys) else dict(keys)  # fetched on the first wake
        self._issuer = issuer.rstrip("/") if issuer else None
        self._secret = base64.b64decode(secret.removeprefix("whsec_")) if secret else None
        self._tolerance = tolerance
        self._clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def _key(self, key_id: str) -> Ed25519PublicKey:
        if key_id not in self._keys and self._fetch is not None:
            self._keys = dict(self._fetch())  # a rotation: the new key is published before it signs
        if key_id not in self._keys:
            raise InvalidWake("unknown signing key")
        return Ed25519PublicKey.from_public_bytes(self._keys[key_id])

    def verify(self, headers: Mapping[str, str], body: bytes) -> dict:
        """The wake, once every check passes."""
        headers = {k.lower(): v for k, v in headers.items()}
        try:
            message_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
            key_id, signatures = headers["webhook-key-id"], headers["webhook-signature"].split()
        except KeyError as missing:
            raise InvalidWake(f"missing header {missing}") from None
        ed25519 = [s[3:] for s in signatures if s.startswith("v1=")]
        if not ed25519:
            raise InvalidWake("no Ed25519 signature")
        signed = f"{key_id}.{timestamp}.".encode() + body
        try:
            self._key(key_id).verify(_b64url_decode(ed25519[0]), signed)
        except (InvalidSignature, binascii.Error, ValueError):
            raise InvalidWake("bad signature") from None
        if self._secret is not None:
            expected = hmac.new(self._secret, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
            macs = [s[3:] for s in signatures if s.startswith("v1,")]
            if not any(hmac.compare_digest(expected, base64.b64decode(m)) for m in macs):
                raise InvalidWake("bad Standard Webhooks signature")
        if not timestamp.isdigit() or abs(self._clock() - int(timestamp)) > self._tolerance:
            raise InvalidWake("stale or future timestamp")
        try:
            wake = json.loads(body)
        except ValueError:
            raise InvalidWake("body is not JSON") from None
        if wake.get("id") != message_id:
            raise InvalidWake("body id differs from Webhook-Id")
        if wake.get("type") not in WAKE_TYPES:
            raise InvalidWake("unknown type")
        if self._issuer is not None and wake.get("type") != "spaces.webhook.challenge" and \
                str(wake.get("issuer", "")).rstrip("/") != self._issuer:
            raise InvalidWake("wrong issuer")
        return wake

    def first_time(self, delivery_id: str) -> bool:
        """True the first time an id is seen (retries repeat the id). In
        memory and bounded; persist ids yourself to dedupe across restarts."""
        if delivery_id in self._seen:
            self._seen.move_to_end(delivery_id)
            return False
        self._seen[delivery_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        return True
