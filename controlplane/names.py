"""Names members give (a space's, a member's display name, a credential's),
checked where they are stored, whoever calls: the API, the web forms and
the management commands alike."""
from __future__ import annotations

from controlplane.errors import InvalidRequest


def checked_name(field: str, value: str, max_chars: int, *, blank: bool = False) -> str:
    """`value` if it is text of at most `max_chars` characters, not only
    whitespace (with `blank`, empty is allowed), with no NUL and no lone
    surrogate; else 400 INVALID_REQUEST naming `field`."""
    empty = "may be empty but not only whitespace" if blank else "may not be empty or only whitespace"
    refusal = InvalidRequest(f"{field} is at most {max_chars} characters of text, and {empty}.",
                             details={"field": field})
    if not isinstance(value, str) or len(value) > max_chars or "\x00" in value:
        raise refusal
    if not value.strip() and not (blank and value == ""):
        raise refusal
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise refusal from None
    return value
