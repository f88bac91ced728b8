"""Serializer building blocks that never coerce: a number is not a string,
"true" is not a boolean, and unknown fields are an error."""
from __future__ import annotations

import copy
import re

from django.http import QueryDict
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import BindingDict


class StrictCharField(serializers.CharField):
    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# RFC 3339's date-time: a full date, a full time, an offset (Z or ±hh:mm).
RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})")


class RFC3339Field(serializers.DateTimeField):
    """A date-time in RFC 3339 only (SPEC §2): DRF's ISO 8601 parser also
    takes a bare date, an ISO week or a time without an offset (read as
    UTC), none of which a client meaning an instant would send. RFC 3339
    allows "t" and "z" in lower case, which DRF's parser does not. Kept to
    the millisecond, as every timestamp is shown: a finer one was stored as
    sent, and the same request again with the value as shown conflicted."""

    def to_internal_value(self, value):
        if not isinstance(value, str) or not RFC3339.fullmatch(value):
            self.fail("invalid", format="RFC 3339 (2027-01-01T00:00:00Z)")
        instant = super().to_internal_value(value.upper())
        return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


class BoundedListField(serializers.ListField):
    """A list whose length is checked before its items: DRF checks every
    item first, so a body of 100,000 one-character items cost seconds of
    CPU and answered megabytes of errors, one per item."""

    def to_internal_value(self, data):
        if self.max_length is not None and isinstance(data, list) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class CursorField(serializers.Field):
    """A cursor or page token as sent. Whether it is one, whatever its length
    or characters, is `controlplane.cursors.unpack_cursor`'s to say: 400
    INVALID_CURSOR, which tells a client to start afresh."""
    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class QueryIntegerField(serializers.IntegerField):
    """An integer query parameter written as plain digits (not `1.0`, `1_0`)."""

    def to_internal_value(self, data):
        if not (isinstance(data, str) and data.isascii() and data.isdigit() and len(data) <= 12):
            self.fail("invalid")
        return super().to_internal_value(data)


# Rejects unknown fields and non-object input.
#
# Its fields are copied and bound once per class, where DRF deep-copies them
# for every instance (every request): these serializers validate input only,
# so they take no instance, context or partial mode (refused here), and their
# fields keep nothing of a call and have no mutable default to share (refused
# when they are bound). (A comment, not a docstring: the schema would publish
# a docstring as the description of every request body without its own.)
class StrictSerializer(serializers.Serializer):

    def __init__(self, instance=None, data=empty, **kwargs):
        if instance is not None or kwargs.get("partial") or kwargs.get("context"):
            raise TypeError(f"{type(self).__name__} validates input only: no instance, partial or context")
        super().__init__(data=data, **kwargs)

    @property
    def fields(self):
        cls = type(self)
        bound = cls.__dict__.get("_bound_fields")
        if bound is None:  # two threads may both build it: the same fields either way
            bound = BindingDict(cls())
            for name, field in copy.deepcopy(cls._declared_fields).items():
                if isinstance(field.default, (list, dict, set)):
                    raise TypeError(f"{cls.__name__}.{name}: a mutable default would be shared by every request")
                bound[name] = field
            cls._bound_fields = bound
        return bound

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def validated(serializer_class, data) -> dict:
    if isinstance(data, QueryDict) and (repeated := sorted(k for k, values in data.lists() if len(values) > 1)):
        # A query string may name a parameter twice, and which one counted
        # (the last) was the server's choice, never said.
        raise serializers.ValidationError({name: ["Given more than once."] for name in repeated})
    if isinstance(data, QueryDict) and (blank := sorted(k for k, value in data.items() if value == "")):
        # DRF reads an empty optional value as one not given: `cursor=`
        # started a feed again from its oldest event, `limit=` took 50.
        raise serializers.ValidationError({name: ["May not be empty."] for name in blank})
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    if isinstance(data, QueryDict) and (unknown := sorted(set(data) - set(serializer_class._declared_fields)
                                                          - {api_settings.URL_FORMAT_OVERRIDE})):
        # As a body's unknown fields are (SPEC §12): `?state=denied` listed
        # the pending requests, `?limt=1` a page of 50.
        raise serializers.ValidationError({name: ["Not a parameter of this route."] for name in unknown})
    return serializer.validated_data
