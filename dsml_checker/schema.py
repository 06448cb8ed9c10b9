"""A compact JSON Schema validator for the subset tool schemas use, so the checker stays standard-library only.

Supported: type (also lists of types; integer vs number as JSON Schema defines them), properties, required,
additionalProperties, enum, const, items, minItems/maxItems, minimum/maximum and their exclusive forms,
minLength/maxLength, anyOf/oneOf/allOf, boolean schemas. Other keywords are ignored, as validators do.
A schema is compiled once into a chain of small checks (a load run validates the same tools many times).
"""

from __future__ import annotations

from typing import Any, Callable

# A compiled check returns None, or "<JSON pointer relative to the value>: <reason>"; parents prefix their key
# only on failure, so valid arguments build no path strings.
Check = Callable[[Any], "str | None"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_PLAIN_TYPES: dict[str, type] = {"string": str, "object": dict, "array": list, "boolean": bool, "null": type(None)}
_KNOWN_TYPES = frozenset({*_PLAIN_TYPES, "number", "integer"})
_BOUNDS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", lambda v, b: v < b, "below"),
    ("maximum", lambda v, b: v > b, "above"),
    ("exclusiveMinimum", lambda v, b: v <= b, "not above"),
    ("exclusiveMaximum", lambda v, b: v >= b, "not below"),
)


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


def _pointer(key: Any) -> str:
    return "/" + str(key).replace("~", "~0").replace("/", "~1")


def _valid(value: Any) -> None:
    return None


def _chain(checks: list[Check]) -> Check:
    if not checks:
        return _valid
    if len(checks) == 1:
        return checks[0]

    def run(value: Any) -> str | None:
        for one in checks:
            error = one(value)
            if error:
                return error
        return None

    return run


def _type_check(expected: Any) -> Check | None:
    names = [n for n in (expected if isinstance(expected, list) else [expected]) if n in _KNOWN_TYPES]
    if not names:
        return None
    plain = tuple(_PLAIN_TYPES[n] for n in names if n in _PLAIN_TYPES)
    number, integer = "number" in names, "integer" in names
    label = " or ".join(names)

    def check(value: Any) -> str | None:
        if isinstance(value, plain):
            return None
        if (number or integer) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if number or isinstance(value, int) or value.is_integer():
                return None
        return f": expected {label}"

    return check


# The keywords compile_schema reads besides "type": a schema with none of them checks the type alone.
_CHECKED = frozenset(
    {"enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
     "minLength", "maxLength", "allOf", "anyOf", "oneOf", *(key for key, _, _ in _BOUNDS)}
)


_EXACT_TYPES: dict[str, tuple[type, ...]] = {
    **{name: (kind,) for name, kind in _PLAIN_TYPES.items()}, "integer": (int,), "number": (int, float),
}


def _exact_types(schema: Any, also: frozenset[str] = frozenset()) -> frozenset[type] | None:
    """The Python types whose every instance (of exactly that type: `type(v) is int` leaves bool out) is valid
    against `schema`, when it checks nothing but its "type" (and the keywords in `also`); None otherwise."""
    if not isinstance(schema, dict) or "type" not in schema or not (schema.keys() - also).isdisjoint(_CHECKED):
        return None
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if not all(isinstance(n, str) and n in _EXACT_TYPES for n in names):
        return None
    return frozenset(t for n in names for t in _EXACT_TYPES[n])


def _exact_item_types(schema: Any) -> frozenset[type] | None:
    """For an array schema that checks only its type and its items' plain types: those item types."""
    types = _exact_types(schema, frozenset({"items"}))
    if types != frozenset({list}) or "items" not in schema:
        return None
    return _exact_types(schema["items"])


def _object_check(schema: dict[str, Any]) -> Check | None:
    required = [k for k in schema.get("required") or () if isinstance(k, str)]
    props_raw = schema.get("properties")
    props = {k: compile_schema(v) for k, v in props_raw.items()} if isinstance(props_raw, dict) else {}
    # Properties of a plain type (most of a tool's), or lists of plain items, pass by a type test in the loop
    # below, not a call each: json.loads builds exact types, and anything else takes the compiled check.
    exact = {k: t for k, v in props_raw.items() if (t := _exact_types(v)) is not None} if props else {}
    lists = {k: t for k, v in props_raw.items() if (t := _exact_item_types(v)) is not None} if props else {}
    extra_raw = schema.get("additionalProperties", True)
    extra = None if extra_raw is True or extra_raw is False else compile_schema(extra_raw)
    closed = extra_raw is False
    if not (required or props or extra or closed):
        return None

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return None
        for key in required:
            if key not in value:
                return f": missing required property {key!r}"
        for key, item in value.items():
            kind = type(item)
            if kind in exact.get(key, ()):
                continue
            if kind is list:
                items = lists.get(key)
                if items is not None and set(map(type, item)) <= items:
                    continue
            sub = props.get(key)
            if sub is None:
                if closed:
                    return f": unexpected property {key!r}"
                sub = extra
                if sub is None:
                    continue
            error = sub(item)
            if error:
                return _pointer(key) + error
        return None

    return check


def _array_check(schema: dict[str, Any]) -> Check | None:
    low, high = schema.get("minItems"), schema.get("maxItems")
    items_raw = schema.get("items")
    items = compile_schema(items_raw) if isinstance(items_raw, (dict, bool)) else None
    if low is None and high is None and items is None:
        return None

    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return None
        if low is not None and len(value) < low:
            return f": fewer than {low} items"
        if high is not None and len(value) > high:
            return f": more than {high} items"
        if items is not None:
            for i, item in enumerate(value):
                error = items(item)
                if error:
                    return f"/{i}{error}"
        return None

    return check


def _scalar_checks(schema: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    short, long = schema.get("minLength"), schema.get("maxLength")
    if short is not None or long is not None:

        def lengths(value: Any) -> str | None:
            if isinstance(value, str):
                if short is not None and len(value) < short:
                    return f": shorter than {short}"
                if long is not None and len(value) > long:
                    return f": longer than {long}"
            return None

        checks.append(lengths)
    bounds = [(key, broken, word, schema[key]) for key, broken, word in _BOUNDS if _is_number(schema.get(key))]
    if bounds:

        def ranges(value: Any) -> str | None:
            if _is_number(value):
                for key, broken, word, bound in bounds:
                    if broken(value, bound):
                        return f": {word} {key} {bound}"
            return None

        checks.append(ranges)
    return checks


def _combinator_checks(schema: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        checks.extend(compile_schema(sub) for sub in all_of)
    any_of = schema.get("anyOf")
    if isinstance(any_of, list) and any_of:
        options = [compile_schema(sub) for sub in any_of]

        def anyof(value: Any) -> str | None:
            if all(option(value) for option in options):
                return ": matches none of anyOf"
            return None

        checks.append(anyof)
    one_of = schema.get("oneOf")
    if isinstance(one_of, list) and one_of:
        choices = [compile_schema(sub) for sub in one_of]

        def oneof(value: Any) -> str | None:
            matched = sum(1 for choice in choices if choice(value) is None)
            return None if matched == 1 else f": matches {matched} of oneOf, not exactly one"

        checks.append(oneof)
    return checks


def compile_schema(schema: Any) -> Check:
    """A function of one instance -> its first violation as "/pointer: reason" relative to it (": reason" at
    the instance itself), or None when it is valid."""
    if schema is False:
        return lambda value: ": no value is allowed"
    if not isinstance(schema, dict):
        return _valid
    checks: list[Check | None] = [_type_check(schema["type"]) if "type" in schema else None]
    if isinstance(schema.get("enum"), list):
        options = schema["enum"]
        checks.append(lambda v: None if any(json_equal(v, o) for o in options) else ": not one of the enum values")
    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v: None if json_equal(v, const) else ": not the const value")
    checks += [_object_check(schema), _array_check(schema), *_scalar_checks(schema), *_combinator_checks(schema)]
    return _chain([c for c in checks if c is not None])


_BY_ID: dict[int, tuple[Any, Check]] = {}
_BY_TEXT: dict[str, Check] = {}
_CACHE_MAX = 512


def _compiled(schema: Any) -> Check:
    """The compiled form of `schema`, cached by identity and, for equal copies, by their text."""
    cached = _BY_ID.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    # Callers often rebuild the same tool list per request (a model_dump each time): the text finds the copy.
    key = repr(schema)
    check = _BY_TEXT.get(key)
    if check is None:
        if len(_BY_TEXT) >= _CACHE_MAX:
            _BY_TEXT.clear()
        check = _BY_TEXT[key] = compile_schema(schema)
    if len(_BY_ID) >= _CACHE_MAX:
        _BY_ID.clear()
    # The entry keeps the schema alive, so its id cannot be reused by another object while cached.
    _BY_ID[id(schema)] = (schema, check)
    return check


def schema_error(instance: Any, schema: Any) -> str | None:
    """The first way `instance` violates `schema` as "/json/pointer: reason", or None when it is valid."""
    error = _compiled(schema)(instance)
    return None if error is None else ("/" + error if error.startswith(":") else error)
