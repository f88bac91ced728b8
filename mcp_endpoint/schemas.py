"""Arguments checked against a tool's or an event's JSON Schema.

Each schema is compiled once into a Python function (fastjsonschema): in a
process that serves `/mcp`, jsonschema and its metaschema registry cost
about 3 MiB more (docs/benchmarks.md, round sixteen). The schemas are this
package's own constants, never a caller's."""
from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import fastjsonschema


def checker(schema: dict) -> Callable[[object], str | None]:
    """A function that names the first way `arguments` misfit `schema`, as
    `arguments.<path> must …`, or answers None when they fit."""
    validate = fastjsonschema.compile(schema)

    def problem(arguments: object) -> str | None:
        try:
            validate(arguments)
        except fastjsonschema.JsonSchemaValueException as error:
            return "arguments" + error.message.removeprefix("data")
        return None

    return problem


class Checked:
    """For a tool or an event source with an `input_schema`: `problem`, its
    checker, compiled at first use."""

    input_schema: dict

    @cached_property
    def problem(self) -> Callable[[object], str | None]:
        return checker(self.input_schema)
