"""Opaque, authenticated and sealed cursors.

A cursor carries only integers; the caller, the stream and the filter it
belongs to are bound by the MAC rather than stored, so a cursor presented by
another caller, on another stream or with another filter fails the check
exactly like a tampered one.

The integers are sealed too (deterministic authenticated encryption, as
SIV builds it from a MAC and a keystream: the MAC of the integers is the
keystream's seed), so a cursor tells its holder nothing. A list's cursor
holds the last row's id, and ids are the host's: two cursors of one's own
list counted the rows everyone had made between them, hidden ones too.
Cursors issued before they were sealed (VERSION_OPEN) are still taken, so
traversals survive an upgrade; only sealed ones are issued.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import struct
from hashlib import sha256

from controlplane.errors import InvalidCursor
from controlplane.keys import purpose_key

VERSION, VERSION_OPEN = b"c2", b"c1"
MAC_BYTES = 16


def _mac(version: bytes, payload: bytes, caller: str, stream: str, filter_: str) -> bytes:
    message = b"|".join([version, caller.encode(), stream.encode(), filter_.encode(), payload])
    return hmac.new(purpose_key("cursor"), message, sha256).digest()[:MAC_BYTES]


def _keystream(mac: bytes, size: int) -> bytes:
    key = purpose_key("cursor-seal")
    blocks = (hmac.new(key, mac + bytes([n]), sha256).digest() for n in range(-(-size // 32)))
    return b"".join(blocks)[:size]


def _xor(data: bytes, stream: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(data, stream))


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def pack_cursor(values: tuple[int, ...] | list[int], *, caller: str, stream: str, filter_: str = "") -> str:
    payload = struct.pack(f">{len(values)}q", *values)
    mac = _mac(VERSION, payload, caller, stream, filter_)
    return _encode(_xor(payload, _keystream(mac, len(payload))) + mac)


def unpack_cursor(token: str, *, count: int | range, caller: str, stream: str, filter_: str = "") -> tuple[int, ...]:
    """The integers inside `token` (`count` of them, or any number in the
    range), or InvalidCursor."""
    if not isinstance(token, str) or not token.isascii() or len(token) > 200:
        raise InvalidCursor()
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise InvalidCursor() from None
    size = len(raw) - MAC_BYTES
    if size % 8 or size // 8 not in (count if isinstance(count, range) else (count,)):
        raise InvalidCursor()
    count = size // 8
    sealed, mac = raw[:size], raw[size:]
    for version, payload in ((VERSION, _xor(sealed, _keystream(mac, size))), (VERSION_OPEN, sealed)):
        if hmac.compare_digest(mac, _mac(version, payload, caller, stream, filter_)):
            # Re-encoding must give back the same text: aliases are tampering too.
            if _encode(raw) != token:
                raise InvalidCursor()
            return struct.unpack(f">{count}q", payload)
    raise InvalidCursor()


def caller_id(member) -> str:
    return member.public_id if member is not None else "anonymous"
