"""URL path converters: a segment that cannot name anything is a 404 before
any view or query runs (a NUL byte, say, which PostgreSQL text refuses)."""
from django.urls import register_converter

PUBLIC_ID = r"[a-z]{3}_[a-z2-7]{16}"


class _Converter:
    regex = ""

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class SlugConverter(_Converter):
    regex = r"[a-z0-9][a-z0-9-]{0,63}"


class HandleConverter(_Converter):
    regex = r"@?[a-z0-9][a-z0-9_-]{1,31}"


class PublicIdConverter(_Converter):
    regex = PUBLIC_ID


class ConversationRefConverter(_Converter):
    """A conversation id, or `#name` for a channel (`%23name` in the URL)."""

    regex = rf"(?:{PUBLIC_ID}|#[a-z0-9][a-z0-9_-]{{0,79}})"  # one group: the schema anchors it whole


class GrantIdConverter(_Converter):
    """Grant ids are client-chosen."""

    regex = r"grt_[A-Za-z0-9_-]{1,64}"


def register() -> None:
    register_converter(SlugConverter, "space")
    register_converter(HandleConverter, "handle")
    register_converter(PublicIdConverter, "pid")
    register_converter(ConversationRefConverter, "conversation")
    register_converter(GrantIdConverter, "grant")
