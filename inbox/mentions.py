"""Mention parsing: which `@handle`s in a body are explicit mentions.

The body is parsed as Markdown (CommonMark + linkify). Handles inside inline
code, code blocks, links (inline, reference and autolinked) and e-mail
addresses do not count; only plain text does.
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from markdown_it import MarkdownIt

# Not after a word character (any script) or address punctuation, so the
# local part of an e-mail address never reads as a mention; nor before one
# (any script): "@josé" names no member "jos". A combining mark after it is
# looked at apart (`_ends_there`): `re` has no class for marks.
MENTION_RE = re.compile(r"(?<![\w.+@-])@([A-Za-z0-9][A-Za-z0-9_-]{1,31})(?![\w@-])")
# An e-mail address that linkify did not take (for example inside emphasis).
# It starts only where a run of address characters starts (the lookbehind),
# and its parts cannot give back what they took (possessive): each character
# is looked at a bounded number of times, so a long "word" costs linear time.
EMAIL_RE = re.compile(r"(?<![\w.%+-])[\w.%+-]++@(?:[\w-]++\.)++\w{2,}+(?![\w-])")


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"linkify": True, "html": False}).enable("linkify")


def _plain_text(body: str) -> list[str]:
    """The text runs of `body` outside code and links."""
    texts: list[str] = []
    for block in _parser().parse(body):
        if block.type != "inline" or not block.children:
            continue
        link_depth = 0
        for token in block.children:
            if token.type == "link_open":
                link_depth += 1
            elif token.type == "link_close":
                link_depth -= 1
            elif token.type == "text" and link_depth == 0:
                texts.append(token.content)
            elif token.type in ("softbreak", "hardbreak"):
                texts.append("\n")
    return texts


def parse_mentions(body: str) -> list[str]:
    """Lower-cased handles explicitly mentioned in `body`, first mention
    first. Linear in the body's length (bench/run.py --only mentions
    measures the worst shapes)."""
    if "@" not in body:
        return []
    seen: dict[str, None] = {}
    for text in _plain_text(body):
        text = EMAIL_RE.sub(" ", text)
        for match in MENTION_RE.finditer(text):
            if _ends_there(text, match.end()):
                seen.setdefault(match.group(1).lower(), None)
    return list(seen)


def _ends_there(text: str, end: int) -> bool:
    """Whether the handle ends at `end`: not if a combining mark follows,
    which makes its last letter another ("@bob" + U+0301 is "@bob́")."""
    return end == len(text) or not unicodedata.category(text[end]).startswith("M")
