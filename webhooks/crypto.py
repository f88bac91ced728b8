"""Secrets at rest and wake signatures.

Endpoint secrets and signing keys are encrypted with AES-256-GCM under keys
derived from `SERVER_ADMIN_KEY` (controlplane.keys); the plaintext exists
only in memory while a request is signed. Wakes are signed with Ed25519
(`Webhook-Signature: v1=<base64url>` over `<key id>.<timestamp>.<body>`)
and, when the endpoint has a `whsec_` secret, also the Standard Webhooks
way (`v1,<base64 HMAC-SHA256>` over `<id>.<timestamp>.<body>`)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from django.db import IntegrityError, transaction

from controlplane.clock import now
from controlplane.errors import InvalidRequest
from controlplane.keys import purpose_key
from controlplane.tokens import b64url

SECRET_RE = re.compile(r"whsec_([A-Za-z0-9+/]+={0,2})")
SECRET_BYTES = (24, 64)


def _aead(purpose: str) -> AESGCM:
    return AESGCM(purpose_key(purpose))


def encrypt(plaintext: bytes, *, purpose: str) -> str:
    nonce = os.urandom(12)
    return base64.b64encode(nonce + _aead(purpose).encrypt(nonce, plaintext, purpose.encode())).decode()


def decrypt(stored: str, *, purpose: str) -> bytes:
    raw = base64.b64decode(stored)
    return _aead(purpose).decrypt(raw[:12], raw[12:], purpose.encode())


# --- endpoint secrets -------------------------------------------------------------

SECRETS = "webhook-endpoint-secrets"


def parse_secret(secret: str) -> bytes:
    """The key bytes of a Standard Webhooks secret (`whsec_` + base64 of
    24–64 bytes), or 400."""
    match = SECRET_RE.fullmatch(secret)
    try:
        raw = base64.b64decode(match.group(1), validate=True) if match else b""
    except (binascii.Error, ValueError):
        raw = b""
    if not SECRET_BYTES[0] <= len(raw) <= SECRET_BYTES[1]:
        raise InvalidRequest("secret must be whsec_ followed by the base64 of 24–64 random bytes.")
    return raw


def seal_secret(secret: str | None) -> str | None:
    return None if secret is None else encrypt(secret.encode(), purpose=SECRETS)


def open_secret(sealed: str | None) -> str | None:
    return None if sealed is None else decrypt(sealed, purpose=SECRETS).decode()


def target_digest(url: str, secret: str | None) -> str:
    """What a verification is bound to: the URL and the secret, keyed so the
    digest reveals neither."""
    message = f"{url}\x00{secret or ''}".encode()
    return hmac.new(purpose_key("webhook-verification"), message, hashlib.sha256).hexdigest()


# --- signing keys -----------------------------------------------------------------

SIGNING = "webhook-signing-keys"


def create_signing_key():
    from webhooks.models import SigningKey

    private = Ed25519PrivateKey.generate()
    raw_private = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    raw_public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SigningKey.objects.create(public_key=b64url(raw_public), private_key=encrypt(raw_private, purpose=SIGNING))


def active_signing_key():
    """The active key, made on first use."""
    from webhooks.models import SigningKey

    key = SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).first()
    if key is None:
        try:
            with transaction.atomic():
                key = create_signing_key()
        except IntegrityError:  # another process made it first
            key = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    return key


def rotate_signing_key():
    """Retire the active key and make a new one. The retired key stays
    published (webhooks.services.published_keys) while it may still be
    needed to verify a request signed with it."""
    from webhooks.models import SigningKey

    with transaction.atomic():
        SigningKey.objects.select_for_update(no_key=True).filter(status=SigningKey.Status.ACTIVE).update(
            status=SigningKey.Status.RETIRED, retired_at=now())
        return create_signing_key()


class Signer:
    """Signs with one key; the private key is decrypted once per Signer."""

    def __init__(self, key):
        self.key_id = key.key_id
        self._private = Ed25519PrivateKey.from_private_bytes(decrypt(key.private_key, purpose=SIGNING))

    def headers(self, message_id: str, body: bytes, *, secret: str | None, timestamp: int) -> dict[str, str]:
        signed = f"{self.key_id}.{timestamp}.".encode() + body
        signatures = [f"v1={b64url(self._private.sign(signed))}"]
        if secret is not None:
            # Standard Webhooks first: its verifiers stop at the first match.
            signatures.insert(0, standard_signature(secret, message_id, body, timestamp))
        return {
            "Content-Type": "application/json",
            "Webhook-Id": message_id,
            "Webhook-Timestamp": str(timestamp),
            "Webhook-Key-Id": self.key_id,
            "Webhook-Signature": " ".join(signatures),
        }


def standard_signature(secret: str, message_id: str, body: bytes, timestamp: int) -> str:
    """One Standard Webhooks signature entry: `v1,<base64 HMAC-SHA256>` of
    `<id>.<timestamp>.<body>` under the secret's key bytes."""
    mac = hmac.new(parse_secret(secret), f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1,{base64.b64encode(mac.digest()).decode()}"


def standard_headers(message_id: str, body: bytes, secrets: list[str], *, timestamp: int,
                     subscription_id: str) -> dict[str, str]:
    """Headers of an MCP-managed delivery: Standard Webhooks signed with
    each of `secrets` (two during a rotation's overlap), plus the
    subscription's id."""
    return {
        "Content-Type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(standard_signature(s, message_id, body, timestamp) for s in secrets),
        "X-MCP-Subscription-Id": subscription_id,
    }
