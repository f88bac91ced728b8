"""A JSON parser that refuses what the database or the contract cannot take:
invalid UTF-8, lone surrogates, NUL and non-standard constants."""
from __future__ import annotations

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from controlplane.errors import InvalidBody


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def _check_text(value, path="$"):
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidBody("Text must not contain NUL.", details={"field": path})
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidBody("Text must be valid UTF-8 (no lone surrogates).", details={"field": path}) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, path)
            _check_text(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{path}[{i}]")


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidBody("The request body is not valid UTF-8.") from None
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ParseError(f"Malformed JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ParseError("The request body must be a JSON object.")
        _check_text(data)
        return data
