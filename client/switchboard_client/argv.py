"""The command line's words: a cursor given as the value of its option,
and the command line that shows a list's next page."""
from __future__ import annotations

import shlex
import sys

CURSOR_OPTIONS = ("--cursor", "--after")


def joined_cursors(words: list[str]) -> list[str]:
    """`--cursor VALUE` and `--after VALUE` as `--cursor=VALUE`: a cursor is
    base64url and may begin with "-", which argparse takes for an option
    ("expected one argument"). Words after `--` are left as they are."""
    out: list[str] = []
    for word in words:
        if out and out[-1] in CURSOR_OPTIONS and "--" not in out:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def next_page_command(cursor: str, argv: list[str] | None = None) -> str:
    """This command line again, with `--cursor` the next page's."""
    words = sys.argv[1:] if argv is None else argv
    kept = [word for n, word in enumerate(words)
            if not (word == "--cursor" or word.startswith("--cursor=") or (n and words[n - 1] == "--cursor"))]
    return shlex.join(["switchboard", *kept, "--cursor", cursor])
