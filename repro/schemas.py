"""JSON Schemas of every file `repro` and `dsml-check` read or write, generated from the models that read
and write them, so the schemas (docs/schemas/*.json, `repro schema NAME`) cannot drift from the code.

Two inputs have no model: metrics.csv's rows (a CSV header, described by its column tuple) and
dsml-check's input lines (dsml_checker is standard-library only, so its reader checks fields by hand;
the schema here says what that reader accepts, and a test holds the two together on real files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import TypeAdapter

from repro.errors import UsageError
from repro.matrix.analysis import CellRun
from repro.matrix.analysis import MatrixAnalysis
from repro.matrix.plan import Plan
from repro.matrix.spec import LOAD_NOT_IN_MATRIX, LOAD_SET_BY_MATRIX, MatrixSpec
from repro.run.metrics import HEADER
from repro.workload.scenario import Workload
from repro.workload.trace import Conversation

DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class SchemaEntry:
    """One file format: its schema's name, what file it describes, and how to build the schema."""

    name: str
    file: str
    """The file (or line of a file) the schema describes, as the docs name it."""
    build: Callable[[], dict[str, Any]]


def _model(target: Any) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        # Validation mode, what readers accept: the records' serialiser is a wrapper (it scrubs lone
        # surrogates), which pydantic can only describe as "any" in serialisation mode.
        return TypeAdapter(target).json_schema(mode="validation")

    return build


def _matrix_spec() -> dict[str, Any]:
    from repro.run.runner import RunOptions

    schema = TypeAdapter(MatrixSpec).json_schema(mode="validation")
    # `load` is a plain mapping in the model (RunOptions validates it per cell); the schema spells it out
    # so an editor completes and checks its keys as they are typed.
    options = TypeAdapter(RunOptions).json_schema(mode="validation")
    for key in (*LOAD_SET_BY_MATRIX, *LOAD_NOT_IN_MATRIX):
        options["properties"].pop(key, None)
    load = schema["properties"]["load"]
    load.update({"properties": options["properties"], "additionalProperties": False})
    schema.setdefault("$defs", {}).update(options.get("$defs", {}))
    return schema


def _run_options() -> dict[str, Any]:
    from repro.run.runner import RunOptions

    return TypeAdapter(RunOptions).json_schema(mode="validation")


def _workload() -> dict[str, Any]:
    return TypeAdapter(Workload).json_schema(mode="validation")


def _trace() -> dict[str, Any]:
    return TypeAdapter(Conversation).json_schema(mode="validation")


def _records(name: str) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        import repro.store.records as records

        return _model(getattr(records, name))()

    return build


def _matrix_result() -> dict[str, Any]:
    return _model(MatrixAnalysis)()


def _progress() -> dict[str, Any]:
    return _model(CellRun)()


def _plan() -> dict[str, Any]:
    return _model(Plan)()


def _metrics_row() -> dict[str, Any]:
    types = {"elapsed_s": "number", "metric": "string", "labels": "string", "value": "number"}
    assert tuple(types) == HEADER, "metrics.csv's columns changed: describe the new ones here"
    return {
        "title": "MetricsRow",
        "description": (
            "One row of metrics.csv (a CSV file with this header, in this column order): a Prometheus sample "
            "scraped from the target's /metrics. elapsed_s is seconds since the run started; labels is the "
            "sample's label set as a JSON object with sorted keys (`{}` without labels)."
        ),
        "type": "object",
        "properties": {column: {"type": kind} for column, kind in types.items()},
        "required": list(HEADER),
        "additionalProperties": False,
    }


def _dsml_input() -> dict[str, Any]:
    message = {
        "type": "object",
        "description": "An OpenAI assistant message: content, reasoning_content and tool_calls as the server returned them.",
    }
    request = {
        "type": "object",
        "description": "What the turn was asked with: the tools offered, tool_choice, and the thinking mode it states.",
        "properties": {"tools": {"type": "array", "items": {"type": "object"}}, "tool_choice": {},
                       "chat_template_kwargs": {"type": "object", "properties": {"thinking": {"type": "boolean"}}}},
    }
    raw = {"type": "string", "description": "The text the model generated for the turn (before the server's parser)."}
    return {
        "title": "DsmlCheckInputLine",
        "description": (
            "One line of dsml-check's input (JSON lines): an OpenAI chat.completion object, or "
            "{\"message\": …, \"finish_reason\": …}; either may carry `request` and `raw`."
        ),
        "type": "object",
        "properties": {"raw": raw, "request": request, "id": {"type": "string"}},
        "anyOf": [
            {
                "required": ["choices"],
                "properties": {
                    "choices": {
                        "type": "array",
                        "minItems": 1,
                        "prefixItems": [
                            {
                                "type": "object",
                                "properties": {"message": message, "finish_reason": {"type": ["string", "null"]}},
                            }
                        ],
                    }
                },
            },
            {"required": ["message"], "properties": {"message": message, "finish_reason": {"type": ["string", "null"]}}},
        ],
    }


def _control() -> dict[str, Any]:
    from repro.store.loops import ControlReport

    return _model(ControlReport)()


SCHEMAS: dict[str, SchemaEntry] = {
    entry.name: entry
    for entry in (
        SchemaEntry("run", "`repro run --config FILE` (YAML): the options of `repro run`", _run_options),
        SchemaEntry("workload", "a workload YAML (`repro run --workload FILE.yaml`)", _workload),
        SchemaEntry("trace", "one line of a trace file (`repro run --workload FILE.jsonl`)", _trace),
        SchemaEntry("matrix", "a matrix spec YAML (`repro matrix SPEC`)", _matrix_spec),
        SchemaEntry("manifest", "RUN_DIR/manifest.json", _records("Manifest")),
        SchemaEntry("session", "one line of RUN_DIR/sessions.jsonl", _records("SessionRecord")),
        SchemaEntry("summary", "RUN_DIR/summary.json", _records("Summary")),
        SchemaEntry("metrics", "one row of RUN_DIR/metrics.csv", _metrics_row),
        SchemaEntry("control", "RUN_DIR/control.json (`repro run --control`)", _control),
        SchemaEntry("matrix-result", "MATRIX_DIR/matrix.json", _matrix_result),
        SchemaEntry("progress", "one line of MATRIX_DIR/progress.jsonl", _progress),
        SchemaEntry("plan", "MATRIX_DIR/plan.json", _plan),
        SchemaEntry("dsml-input", "one line of `dsml-check`'s input", _dsml_input),
    )
}


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema called `name` (a key of SCHEMAS), with its dialect and the file it describes."""
    entry = SCHEMAS.get(name)
    if entry is None:
        raise UsageError(f"schema: unknown name {name!r}; expected one of {', '.join(SCHEMAS)}")
    built = entry.build()
    return {"$schema": DIALECT, "$comment": f"Generated by `repro schema {name}`: {entry.file}.", **built}


def render(name: str) -> str:
    """The schema as the checked-in file holds it."""
    return json.dumps(schema(name), indent=2, ensure_ascii=False) + "\n"


def write_all(directory: Path) -> list[Path]:
    """Write every schema to DIRECTORY/<name>.json and the field reference to DIRECTORY/../formats.md."""
    from repro.store.rundir import check_output

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"schema --write {directory}: cannot create: {err.strerror or err}") from None
    files = {directory / f"{name}.json": render(name) for name in SCHEMAS}
    files[directory.parent / FORMATS_PAGE] = markdown()
    for path in files:
        check_output(path, [], "schema --write")
    for path, text in files.items():
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            raise UsageError(f"schema --write {path}: cannot write: {err.strerror or err}") from None
    return list(files)


FORMATS_PAGE = "formats.md"
"""The generated field reference, beside the schemas in docs/."""


def _type_of(prop: dict[str, Any]) -> str:
    """A field's type in a few words: `integer`, `list of Level`, `string or null`."""
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(_type_of(option) for option in prop["anyOf"])
    if "enum" in prop:
        return " or ".join(f"`{value}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(prop.get('items', {}))}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {_type_of(prop['additionalProperties'])}"
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(title: str, obj: dict[str, Any]) -> list[str]:
    required = set(obj.get("required", ()))
    lines = [f"#### {title}", ""]
    if obj.get("description"):
        lines += [_cell(obj["description"]), ""]
    lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
    for field, prop in obj.get("properties", {}).items():
        default = "required" if field in required else f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        lines.append(f"| `{field}` | {_cell(_type_of(prop))} | {_cell(default)} | {_cell(prop.get('description', ''))} |")
    return [*lines, ""]


def markdown() -> str:
    """docs/formats.md: every schema's fields, one table per object, from the same schemas as the JSON files."""
    out = [
        "# File formats",
        "",
        "<!-- Generated by `repro schema --write docs/schemas` from the models that read and write these files;",
        "     do not edit: a test fails when this page and the code differ. -->",
        "",
        "Every file that `repro` and `dsml-check` read or write, field by field. The JSON Schema of each is in",
        "[schemas/](schemas/) and printed by `repro schema NAME`; editors that speak the YAML language server",
        "validate the shipped YAML files against them as you type (see [schema.md](schema.md)).",
        "",
    ]
    for entry in SCHEMAS.values():
        built = schema(entry.name)
        out += [f"## `{entry.name}`: {entry.file}", "", f"Schema: [schemas/{entry.name}.json](schemas/{entry.name}.json)", ""]
        out += _table(built.get("title", entry.name), built)
        for name, definition in built.get("$defs", {}).items():
            if definition.get("type") == "object" and definition.get("properties"):
                out += _table(name, definition)
    return "\n".join(out).rstrip("\n") + "\n"
