"""Opaque, HMAC-authenticated cursors.

A cursor carries only integers; the caller, the stream and the filter it
belongs to are bound by the MAC rather than stored, so a cursor presented by
another caller, on another stream or with another filter fails the check
exactly like a tampered one.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import struct
from hashlib import sha256

from controlplane.errors import InvalidCursor
from controlplane.keys import purpose_key

VERSION = b"c1"
MAC_BYTES = 16


def _mac(payload: bytes, caller: str, stream: str, filter_: str) -> bytes:
    message = b"|".join([VERSION, caller.encode(), stream.encode(), filter_.encode(), payload])
    return hmac.new(purpose_key("cursor"), message, sha256).digest()[:MAC_BYTES]


def pack_cursor(values: tuple[int, ...] | list[int], *, caller: str, stream: str, filter_: str = "") -> str:
    payload = struct.pack(f">{len(values)}q", *values)
    raw = payload + _mac(payload, caller, stream, filter_)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unpack_cursor(token: str, *, count: int, caller: str, stream: str, filter_: str = "") -> tuple[int, ...]:
    """The integers inside `token`, or InvalidCursor."""
    if not isinstance(token, str) or not token.isascii() or len(token) > 200:
        raise InvalidCursor()
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise InvalidCursor() from None
    size = 8 * count
    if len(raw) != size + MAC_BYTES:
        raise InvalidCursor()
    payload, mac = raw[:size], raw[size:]
    if not hmac.compare_digest(mac, _mac(payload, caller, stream, filter_)):
        raise InvalidCursor()
    # Re-encoding must give back the same text: aliases are tampering too.
    if pack_cursor(struct.unpack(f">{count}q", payload), caller=caller, stream=stream, filter_=filter_) != token:
        raise InvalidCursor()
    return struct.unpack(f">{count}q", payload)


def caller_id(member) -> str:
    return member.public_id if member is not None else "anonymous"
