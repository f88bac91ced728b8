"""Text fields as the contract takes them."""
from __future__ import annotations

from controlplane.errors import BodyTooLarge, InvalidBody


def encode_text(value: str, *, field: str, max_bytes: int, too_large=BodyTooLarge) -> bytes:
    """UTF-8 bytes of `value`: 422 for lone surrogates or NUL, 413 (or
    `too_large`) over `max_bytes`, 422 when empty."""
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidBody(f"{field} is not valid UTF-8 text (lone surrogate).", details={"field": field}) from None
    if "\x00" in value:
        raise InvalidBody(f"{field} must not contain NUL.", details={"field": field})
    if not raw:
        raise InvalidBody(f"{field} must not be empty.", details={"field": field})
    if len(raw) > max_bytes:
        raise too_large(f"{field} is {len(raw)} bytes; the limit is {max_bytes}.",
                        details={"field": field, "bytes": len(raw), "max_bytes": max_bytes})
    return raw
