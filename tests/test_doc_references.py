"""Every test the docs name exists: a reader who follows
`tests/….py::test_name` (or a `::test_name` after it in the same
paragraph) finds it. A name ending in `*` names every test it begins."""
from __future__ import annotations

import re

from tests.servers import ROOT

SPAN = re.compile(r"`([\w/…]+\.py)?(?:::(\w+\*?))?(?:\[[^\]`]*\])?`")


def named_tests(text: str):
    """(path, test name or None) for every reference, paragraph by paragraph
    (a short path, `test_pages.py::…`, is left to the reader)."""
    for paragraph in re.split(r"\n\s*\n", text):
        path = None
        for span_path, name in SPAN.findall(paragraph):
            if span_path:
                path = span_path if span_path.startswith("tests/") else None
            if path is not None and (span_path or name):
                yield path, name or None


def test_every_test_the_docs_name_exists():
    missing = []
    for document in [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]:
        for path, name in set(named_tests(document.read_text())):
            source = ROOT / path
            if not source.exists():
                missing.append(f"{document.name}: {path}")
            elif name is not None:
                pattern = rf"^\s*(async )?def {name[:-1]}\w*" if name.endswith("*") else rf"^\s*(async )?def {name}\b"
                if not re.search(pattern, source.read_text(), re.M):
                    missing.append(f"{document.name}: {path}::{name}")
    assert sorted(missing) == []
