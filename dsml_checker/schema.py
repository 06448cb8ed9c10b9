"""A compact JSON Schema validator for the subset tool schemas use, so the checker stays standard-library only.

Supported: type (also lists of types; integer vs number as JSON Schema defines them), properties, required,
additionalProperties, enum, const, items, minItems/maxItems, minimum/maximum and their exclusive forms,
minLength/maxLength, anyOf/oneOf/allOf, boolean schemas. Other keywords are ignored, as validators do.
"""

from __future__ import annotations

from typing import Any

_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _has_type(value: Any, name: str) -> bool:
    if name == "integer":
        return _is_number(value) and (isinstance(value, int) or value.is_integer())
    if name == "number":
        return _is_number(value)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    return True


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: booleans are not numbers, 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _where(path: str) -> str:
    return path or "/"


def schema_error(instance: Any, schema: Any, path: str = "") -> str | None:
    """The first way `instance` violates `schema`, as "/json/pointer: reason", or None when it is valid."""
    if schema is False:
        return f"{_where(path)}: no value is allowed"
    if not isinstance(schema, dict):
        return None
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_has_type(instance, n) for n in names if n in _TYPES):
            return f"{_where(path)}: expected {' or '.join(map(str, names))}"
    if "enum" in schema and isinstance(schema["enum"], list):
        if not any(json_equal(instance, option) for option in schema["enum"]):
            return f"{_where(path)}: not one of the enum values"
    if "const" in schema and not json_equal(instance, schema["const"]):
        return f"{_where(path)}: not the const value"
    error = (
        _object_error(instance, schema, path)
        or _array_error(instance, schema, path)
        or _scalar_error(instance, schema, path)
    )
    if error:
        return error
    return _combinator_error(instance, schema, path)


def _object_error(instance: Any, schema: dict[str, Any], path: str) -> str | None:
    if not isinstance(instance, dict):
        return None
    for key in schema.get("required") or ():
        if key not in instance:
            return f"{_where(path)}: missing required property {key!r}"
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties", True)
    for key, value in instance.items():
        sub = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
        if key in props:
            error = schema_error(value, props[key], sub)
        elif extra is False:
            error = f"{_where(path)}: unexpected property {key!r}"
        else:
            error = schema_error(value, extra, sub)
        if error:
            return error
    return None


def _array_error(instance: Any, schema: dict[str, Any], path: str) -> str | None:
    if not isinstance(instance, list):
        return None
    if "minItems" in schema and len(instance) < schema["minItems"]:
        return f"{_where(path)}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(instance) > schema["maxItems"]:
        return f"{_where(path)}: more than {schema['maxItems']} items"
    items = schema.get("items")
    if isinstance(items, (dict, bool)):
        for i, item in enumerate(instance):
            error = schema_error(item, items, f"{path}/{i}")
            if error:
                return error
    return None


def _scalar_error(instance: Any, schema: dict[str, Any], path: str) -> str | None:
    if isinstance(instance, str):
        if "minLength" in schema and len(instance) < schema["minLength"]:
            return f"{_where(path)}: shorter than {schema['minLength']}"
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            return f"{_where(path)}: longer than {schema['maxLength']}"
    elif _is_number(instance):
        bounds = (
            ("minimum", lambda v, b: v < b, "below"),
            ("maximum", lambda v, b: v > b, "above"),
            ("exclusiveMinimum", lambda v, b: v <= b, "not above"),
            ("exclusiveMaximum", lambda v, b: v >= b, "not below"),
        )
        for key, broken, word in bounds:
            bound = schema.get(key)
            if _is_number(bound) and broken(instance, bound):
                return f"{_where(path)}: {word} {key} {bound}"
    return None


def _combinator_error(instance: Any, schema: dict[str, Any], path: str) -> str | None:
    for sub in schema.get("allOf") or ():
        error = schema_error(instance, sub, path)
        if error:
            return error
    any_of = schema.get("anyOf")
    if isinstance(any_of, list) and any_of and all(schema_error(instance, sub, path) for sub in any_of):
        return f"{_where(path)}: matches none of anyOf"
    one_of = schema.get("oneOf")
    if isinstance(one_of, list) and one_of:
        matched = sum(1 for sub in one_of if schema_error(instance, sub, path) is None)
        if matched != 1:
            return f"{_where(path)}: matches {matched} of oneOf, not exactly one"
    return None
