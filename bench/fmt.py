"""How the benchmark reports write a figure and a verdict."""
from __future__ import annotations


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("yes" if ok else "**no**")
