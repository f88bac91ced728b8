"""Cursors (SPEC §6: opaque): bound to their caller, stream and filter, and
sealed, so that they tell their holder nothing."""
import base64
import hmac
import struct
from hashlib import sha256

import pytest

from controlplane import cursors
from controlplane.errors import InvalidCursor
from controlplane.keys import purpose_key


def _raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def test_a_cursor_shows_no_integer_it_holds(db):
    # given: a list's cursor at row 48, then at row 51 (a host-wide id: two rows made elsewhere between)
    first = cursors.pack_cursor((48,), caller="mem_a", stream="conversations:7")
    second = cursors.pack_cursor((51,), caller="mem_a", stream="conversations:7")
    # then: neither holds its id as it was (an open cursor began with it), and each gives it back
    assert struct.pack(">q", 48) not in _raw(first) and struct.pack(">q", 51) not in _raw(second)
    assert cursors.unpack_cursor(second, count=1, caller="mem_a", stream="conversations:7") == (51,)
    # and the same integers always make the same cursor (an empty page answers with the one it was given)
    assert cursors.pack_cursor((48,), caller="mem_a", stream="conversations:7") == first


@pytest.mark.parametrize("change", ["caller", "stream", "filter", "bit", "alias"])
def test_a_cursor_is_refused_anywhere_else_and_in_any_other_form(db, change):
    token = cursors.pack_cursor((5, 9), caller="mem_a", stream="s", filter_="open")
    where = {"caller": "mem_a", "stream": "s", "filter_": "open"}
    if change in ("caller", "stream", "filter"):
        where[{"filter": "filter_"}.get(change, change)] = "other"
    elif change == "bit":
        raw = bytearray(_raw(token))
        raw[3] ^= 1
        token = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    else:  # the same bytes, written with a last character whose unused bits differ (32 bytes: 43 characters)
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        token = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]
        assert _raw(token) == _raw(cursors.pack_cursor((5, 9), caller="mem_a", stream="s", filter_="open"))
    with pytest.raises(InvalidCursor):
        cursors.unpack_cursor(token, count=2, **where)


def test_a_cursor_issued_before_cursors_were_sealed_is_still_taken(db):
    # given: an open cursor, as they were issued before (the integers, then their MAC)
    payload = struct.pack(">2q", 5, 9)
    message = b"|".join([b"c1", b"mem_a", b"s", b"", payload])
    mac = hmac.new(purpose_key("cursor"), message, sha256).digest()[:16]
    old = base64.urlsafe_b64encode(payload + mac).rstrip(b"=").decode()
    # then: a traversal begun before an upgrade goes on
    assert cursors.unpack_cursor(old, count=2, caller="mem_a", stream="s") == (5, 9)
    with pytest.raises(InvalidCursor):
        cursors.unpack_cursor(old, count=2, caller="mem_b", stream="s")
