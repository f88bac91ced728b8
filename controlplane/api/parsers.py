"""A JSON parser that refuses what the database or the contract cannot take:
invalid UTF-8, lone surrogates, NUL, non-standard constants and a key given
twice in one object."""
from __future__ import annotations

import json

from django.conf import settings
from rest_framework.parsers import BaseParser

from controlplane.errors import BodyTooLarge, InvalidBody, InvalidRequest


def _reject_constant(name):
    raise InvalidRequest(f"Malformed JSON: {name} is not JSON.")


def _object_without_repeats(pairs: list[tuple[str, object]]) -> dict:
    """An object whose keys are unique (I-JSON, RFC 7493). Python keeps the
    last of a repeated key where other parsers keep the first, so a proxy
    or a signature check in front could read another body than the API."""
    data = dict(pairs)
    if len(data) < len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidRequest(f"Malformed JSON: the key {key[:64]!r} appears twice in one object.")
            seen.add(key)
    return data


MAX_DEPTH = 32


def check_text(data) -> None:
    """Every string is storable text (no NUL, no lone surrogate), and the
    nesting is shallow. Iterative, so no input can exhaust the stack."""
    stack = [(data, "$", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"JSON nested deeper than {MAX_DEPTH} levels.")
        if isinstance(value, str):
            if "\x00" in value:
                raise InvalidBody("Text must not contain NUL.", details={"field": path})
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidBody("Text must be valid UTF-8 (no lone surrogates).", details={"field": path}) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, path, depth + 1))
                stack.append((item, f"{path}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        # DRF reads the stream itself, past Django's upload limit: enforce it here.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge("The request is too large.", details={"max_bytes": limit})
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise BodyTooLarge("The request is too large.", details={"max_bytes": limit})
        return parse_json_object(raw)


def parse_json_object(raw: bytes) -> dict:
    """A request body as a JSON object, by the API's rules, wherever it
    arrives (the API's parser, the web app's scripts): invalid UTF-8, lone
    surrogates and NUL are 422; malformed, non-object or too deeply nested
    JSON, or a key repeated in one object, is 400."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidBody("The request body is not valid UTF-8.") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object_without_repeats)
    except RecursionError:
        raise InvalidRequest(f"JSON nested deeper than {MAX_DEPTH} levels.") from None
    except json.JSONDecodeError as exc:  # where and what, in the parser's words
        raise InvalidRequest(f"Malformed JSON: {exc}") from None
    except ValueError:  # a number past Python's digit limit (the parser's message names interpreter settings)
        raise InvalidRequest("Malformed JSON: a number has too many digits.") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    check_text(data)
    return data
