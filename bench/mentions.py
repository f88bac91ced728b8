"""Mention parsing on the bodies that cost it most (an 8 KiB body is the
largest a send accepts), beside ordinary prose of the same size, and how the
cost grows from 2 KiB to 8 KiB (4.0 is linear). In-process: no server."""
from __future__ import annotations

import statistics
import time

SHAPES = {
    "ordinary prose": "hello @bob, see notes.md and x.y before friday ",
    "one long word, then @": None,
    "dotted word (a.a.a…)": "a.",
    "e-mail addresses": "ann@example.com ",
    "opening brackets ([[[…)": "[",
    "image brackets (![![…)": "![",
    "lone @ signs": "@",
}


def _body(shape: str | None, size: int) -> str:
    if shape is None:
        return "a" * (size - 1) + "@"
    body = (shape * (size // len(shape) + 1))[:size - 5]
    return body + " @bob"


def _median_ms(parse, body: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        parse(body)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def run(repeats: int = 7) -> dict:
    from inbox.mentions import parse_mentions

    rows = {}
    for name, shape in SHAPES.items():
        small = _median_ms(parse_mentions, _body(shape, 2048), repeats)
        big = _median_ms(parse_mentions, _body(shape, 8192), repeats)
        rows[name] = {"ms_8k": round(big, 2), "ms_2k": round(small, 2), "growth_2k_to_8k": round(big / small, 2)}
    prose = rows["ordinary prose"]["ms_8k"]
    for row in rows.values():
        row["vs_prose"] = round(row["ms_8k"] / prose, 1)
    return {"shapes": rows, "worst": max(rows, key=lambda n: rows[n]["ms_8k"])}
