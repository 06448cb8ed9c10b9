"""The checker's compact schema validator agrees with the real `jsonschema` on the subset tool schemas use."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsml_checker.schema import json_equal, schema_error

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

small_ints = st.integers(-3, 3)
scalar_values = st.none() | st.booleans() | small_ints | st.sampled_from([0.5, 1.0, -2.0]) | st.sampled_from(["", "a", "ab", "abc"])
values = st.recursive(
    scalar_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    max_leaves=8,
)
type_names = st.sampled_from(["null", "boolean", "object", "array", "number", "string", "integer"])


def _leaf_schemas() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda t: {"type": t}, type_names),
        st.builds(lambda ts: {"type": ts}, st.lists(type_names, min_size=1, max_size=3, unique=True)),
        st.builds(lambda e: {"enum": e}, st.lists(scalar_values, min_size=1, max_size=3)),
        st.builds(lambda c: {"const": c}, scalar_values),
        st.builds(lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": hi}, st.integers(0, 2), st.integers(1, 3)),
        st.builds(lambda lo, hi: {"minimum": lo, "maximum": hi}, small_ints, small_ints),
        st.builds(lambda lo, hi: {"exclusiveMinimum": lo, "exclusiveMaximum": hi}, small_ints, small_ints),
        st.just({}),
    )


schemas = st.recursive(
    _leaf_schemas(),
    lambda inner: st.one_of(
        st.builds(
            lambda props, req, extra: {
                "type": "object",
                "properties": props,
                "required": req,
                **({} if extra is None else {"additionalProperties": extra}),
            },
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
            st.none() | st.booleans() | inner,
        ),
        st.builds(
            lambda items, lo, hi: {"type": "array", "items": items, "minItems": lo, "maxItems": hi},
            inner,
            st.integers(0, 1),
            st.integers(1, 3),
        ),
        st.builds(lambda subs: {"anyOf": subs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda subs: {"oneOf": subs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda subs: {"allOf": subs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


@SETTINGS
@given(schema=schemas, instance=values)
def test_subset_validator_agrees_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    expected = jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert (schema_error(instance, schema) is None) == expected, (schema, instance)


@SETTINGS
@given(schema=schemas, data=st.data())
def test_instances_built_to_match_are_accepted_by_both(schema: dict[str, Any], data: st.DataObject) -> None:
    # Sampling from enum/const values exercises the accepting side, which random instances rarely reach.
    candidates = [v for key in ("enum", "const") for v in (schema.get(key) if key == "enum" else [schema.get(key)]) or []]
    instance = data.draw(st.sampled_from(candidates)) if candidates else data.draw(values)
    expected = jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert (schema_error(instance, schema) is None) == expected


TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("instance", "fragment"),
    [
        ({"city": "Paris"}, None),
        ({"city": "Paris", "days": 2.0}, None),
        ({}, "missing required property 'city'"),
        ({"city": ""}, "/city: shorter than 1"),
        ({"city": "Paris", "days": True}, "/days: expected integer"),
        ({"city": "Paris", "days": 15}, "/days: above maximum 14"),
        ({"city": "Paris", "units": "k"}, "/units: not one of the enum values"),
        ({"city": "Paris", "tags": ["a", 1]}, "/tags/1: expected string"),
        ({"city": "Paris", "tags": ["a", "b", "c"]}, "/tags: more than 2 items"),
        ({"city": "Paris", "zone": 1}, "unexpected property 'zone'"),
    ],
)
def test_errors_name_the_json_pointer_and_reason(instance: dict[str, Any], fragment: str | None) -> None:
    error = schema_error(instance, TOOL_SCHEMA)
    assert (error is None) == (fragment is None)
    if fragment is not None:
        assert fragment in error
    assert (error is None) == jsonschema.Draft202012Validator(TOOL_SCHEMA).is_valid(instance)


def test_json_equality_separates_booleans_from_numbers() -> None:
    assert json_equal(1, 1.0) and not json_equal(1, True) and not json_equal(0, False)
    assert json_equal({"a": [1, None]}, {"a": [1.0, None]}) and not json_equal([1], [True])


def test_compiled_schemas_are_reused_only_for_equal_content() -> None:
    first = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    rebuilt = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    stricter = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5}}}
    assert schema_error({"n": 3}, first) is None
    assert schema_error({"n": 3}, rebuilt) is None
    assert schema_error({"n": 3}, stricter) == "/n: below minimum 5"
    assert schema_error({"n": 0}, rebuilt) == "/n: below minimum 1"
