"""Summarize py-spy's collapsed stacks (`bench/run.py --profile-sends`):
the share of samples under each function (inclusive) and at the top of the
stack (self), per file.

    .venv/bin/python bench/profile.py bench/results/<stamp>/sends-serve.collapsed [--top 40] [--grep WORD]
"""
from __future__ import annotations

import argparse
import collections
import re

FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """'send_message (inbox/services.py:42)' -> 'send_message (inbox/services.py)'."""
    m = FRAME_RE.match(frame.strip())
    if not m:
        return frame.strip()
    file = m["file"]
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m['func']} ({file})"


def summarize(path: str, grep: str | None = None) -> tuple[int, collections.Counter, collections.Counter]:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            if grep and grep not in stack:
                continue
            n = int(count)
            frames = [frame_name(fr) for fr in stack.split(";") if fr]
            total += n
            for name in set(frames):
                inclusive[name] += n
            if frames:
                own[frames[-1]] += n
    return total, inclusive, own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--grep", help="only stacks that contain this text")
    args = p.parse_args()
    total, inclusive, own = summarize(args.path, args.grep)
    print(f"{total} samples")
    print("\n| inclusive | self | function |\n| ---: | ---: | --- |")
    for name, n in inclusive.most_common(args.top):
        print(f"| {100 * n / total:.1f}% | {100 * own[name] / total:.1f}% | `{name}` |")


if __name__ == "__main__":
    main()
