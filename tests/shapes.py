"""Every API response the suite receives must have the shape the published
schema gives for its route, method and status.

A resource's shape is declared once, as its `*Out` serializer: that is what
/v0/schema publishes. Views answer through fast render functions
(controlplane/render.py, inbox/render.py, grants/render.py,
webhooks/render.py); this check, run on each of the suite's API calls, makes
a render that drifts from its declaration fail the test that made the call.
"""
from __future__ import annotations

import functools
import re

import jsonschema


def _nullable(node):
    """OpenAPI 3.0 → JSON Schema: `nullable` becomes "or null"; objects with
    declared properties allow no others (a key the schema does not name is
    drift too)."""
    if isinstance(node, list):
        return [_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable(v) for k, v in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if node.pop("nullable", False):
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def _schema() -> tuple[dict, list[tuple[re.Pattern, dict]]]:
    from drf_spectacular.generators import SchemaGenerator

    document = SchemaGenerator().get_schema(request=None, public=True)
    components = _nullable(document.get("components", {}))
    routes = []
    for template, operations in document["paths"].items():
        pattern = re.compile("^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$")
        routes.append((pattern, operations))
    return components, routes


def check_response(method: str, path: str, response) -> None:
    """Raise AssertionError when `response` (JSON) does not fit the schema.
    Routes outside the schema (pages, health) are not checked."""
    if response.get("Content-Type", "").split(";")[0] != "application/json" or not path.startswith("/v0/"):
        return
    components, routes = _schema()
    path = path.split("?")[0]
    operation = next((ops.get(method.lower()) for pattern, ops in routes if pattern.match(path)), None)
    if operation is None:
        return  # 404/405 for a route that does not exist: the error shape is checked by its own tests
    declared = operation["responses"].get(str(response.status_code))
    assert declared is not None, (f"{method.upper()} {path} answered {response.status_code}, "
                                  f"which its schema does not list")
    if response.status_code >= 400:  # the code must be one the route's schema names (controlplane.api.schema.errors)
        code = response.json().get("error", {}).get("code")
        assert f"`{code}`" in declared.get("description", ""), (
            f"{method.upper()} {path} answered {response.status_code} {code}, which its schema does not list")
    content = declared.get("content", {}).get("application/json")
    if content is None:
        return
    schema = {**_nullable(content["schema"]), "components": components}
    try:
        jsonschema.validate(response.json(), schema)
    except jsonschema.ValidationError as error:
        where = "/".join(map(str, error.absolute_path)) or "(top)"
        raise AssertionError(f"{method.upper()} {path} → {response.status_code} does not fit its schema at "
                             f"{where}: {error.message}") from None
