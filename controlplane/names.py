"""Names members give (a space's, a member's display name, a credential's),
checked where they are stored, whoever calls: the API, the web forms and
the management commands alike."""
from __future__ import annotations

import unicodedata

from controlplane.errors import InvalidRequest

# Characters that reorder the text around them (embeddings, overrides and
# isolates): a name holding one shows other names, or a message's author,
# in an order other than the one stored ("Trojan Source"). The marks that
# only set a direction (U+200E, U+200F, U+061C) stay allowed: right-to-left
# names need them and they move nothing outside the name.
REORDERING = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def checked_name(field: str, value: str, max_chars: int, *, blank: bool = False) -> str:
    """`value` if it is one line of text of at most `max_chars` characters,
    not only whitespace (with `blank`, empty is allowed), with no control
    character (NUL, a line break, a tab), no line or paragraph separator
    (U+2028, U+2029), no character that reorders the
    text around it (`REORDERING`) and no lone surrogate; else 400
    INVALID_REQUEST naming `field`."""
    empty = "may be empty but not only whitespace" if blank else "may not be empty or only whitespace"
    refusal = InvalidRequest(f"{field} is one line of at most {max_chars} characters of text, with no control "
                             f"or reordering characters, and {empty}.", details={"field": field})
    if not isinstance(value, str) or len(value) > max_chars:
        raise refusal
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in REORDERING for c in value):
        raise refusal
    if not value.strip() and not (blank and value == ""):
        raise refusal
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise refusal from None
    return value
