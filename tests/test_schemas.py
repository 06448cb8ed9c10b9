"""The JSON Schemas of docs/schemas and the field reference docs/formats.md: what the models produce, every input
field described, and real files (a real `repro matrix` of simulator cells, the shipped YAML, the examples) valid."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import repro.store.records
from repro.errors import UniqueKeyLoader
from repro.matrix.spec import SpecLoader
from repro.schemas import FORMATS_PAGE, SCHEMAS, markdown, render, schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REGENERATE = "run `repro schema --write docs/schemas` and commit the result"


def validator(name: str) -> jsonschema.Draft202012Validator:
    built = schema(name)
    jsonschema.Draft202012Validator.check_schema(built)
    return jsonschema.Draft202012Validator(built)


def assert_valid(name: str, instance: Any, where: str) -> None:
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    assert not errors, f"{where} does not match schema {name}: {errors[0].message} at {list(errors[0].absolute_path)}"


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_checked_in_schema_is_what_the_models_produce(name: str) -> None:
    path = DOCS / "schemas" / f"{name}.json"
    assert path.read_text(encoding="utf-8") == render(name), f"{path} is stale: {REGENERATE}"


def test_the_field_reference_is_what_the_models_produce() -> None:
    assert (DOCS / FORMATS_PAGE).read_text(encoding="utf-8") == markdown(), f"docs/{FORMATS_PAGE} is stale: {REGENERATE}"


def test_a_field_added_to_a_model_fails_the_drift_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    class Grown(repro.store.records.Summary):
        brand_new_count: int = 0
        """A field someone added."""

    monkeypatch.setattr(repro.store.records, "Summary", Grown)
    assert "brand_new_count" in render("summary")
    assert render("summary") != (DOCS / "schemas" / "summary.json").read_text(encoding="utf-8")
    assert "`brand_new_count`" in markdown() and markdown() != (DOCS / FORMATS_PAGE).read_text(encoding="utf-8")


def _fields(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    for key, prop in node.get("properties", {}).items():
        found.append((f"{path}{key}", prop))
    return found


@pytest.mark.parametrize("name", ["run", "workload", "trace", "matrix"])
def test_every_field_a_user_writes_is_described(name: str) -> None:
    built = schema(name)
    objects = {"(top)": built, **{k: v for k, v in built.get("$defs", {}).items() if v.get("properties")}}
    missing = [f"{obj}.{field}" for obj, node in objects.items() for field, prop in _fields(node) if not prop.get("description")]
    assert not missing, f"fields without a docstring (the docs would show nothing): {missing}"


@pytest.mark.parametrize("path", sorted([*ROOT.glob("matrices/*.yaml"), *ROOT.glob("experiments/*.yaml")]), ids=lambda p: p.name)
def test_shipped_yaml_names_its_schema_for_editors_and_matches_it(path: Path) -> None:
    name = "matrix" if path.parent.name == "matrices" else "workload"
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == f"# yaml-language-server: $schema=../docs/schemas/{name}.json"
    assert (path.parent / first.split("=", 1)[1]).resolve() == (DOCS / "schemas" / f"{name}.json").resolve()
    # Read as repro reads it (YAML 1.2 words: `off` is a string, as for the YAML language server).
    loader = SpecLoader if name == "matrix" else UniqueKeyLoader
    assert_valid(name, yaml.load(path.read_text(encoding="utf-8"), Loader=loader), str(path))


def test_a_misspelt_matrix_key_fails_the_schema_as_it_fails_the_loader() -> None:
    spec = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"]["sesions"] = 10
    assert list(validator("matrix").iter_errors(spec))
    spec["load"].pop("sesions")
    spec["design"]["replicate"] = 2
    assert list(validator("matrix").iter_errors(spec))


def test_example_inputs_match_their_schemas() -> None:
    for number, line in enumerate((ROOT / "examples" / "responses.jsonl").read_text(encoding="utf-8").splitlines(), 1):
        assert_valid("dsml-input", json.loads(line), f"examples/responses.jsonl:{number}")
    for number, line in enumerate((ROOT / "examples" / "traces.jsonl").read_text(encoding="utf-8").splitlines(), 1):
        assert_valid("trace", json.loads(line), f"examples/traces.jsonl:{number}")
    assert list(validator("dsml-input").iter_errors({"finish_reason": "stop"}))  # neither choices nor message


@pytest.mark.slow
def test_every_file_of_a_real_matrix_run_matches_its_schema(tmp_path: Path) -> None:
    spec = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"] = {**spec["load"], "workload": str(ROOT / "experiments" / "agentic_coding.yaml"),
                    "sessions": 4, "concurrency": 4, "turns": 3, "pressure": "auto"}
    spec["design"] = {**spec["design"], "replicates": 1, "min_completed": 2}
    # A device pool these few sessions overflow, so that HiCache-on cells exercise it and count.
    spec["deployment"]["command"] += " --enable-metrics --max-total-tokens 16000"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    assert_valid("matrix", spec, "the test's spec")
    matrix = tmp_path / "matrix"
    done = subprocess.run([sys.executable, "-c", "from repro.cli import main; main()", "matrix", str(spec_path),
                           "--out", str(matrix), "--no-cell-reports"], cwd=ROOT, capture_output=True, timeout=280)
    assert done.returncode == 0, done.stdout.decode()[-2000:] + done.stderr.decode()[-2000:]

    assert_valid("plan", json.loads((matrix / "plan.json").read_text()), "plan.json")
    assert_valid("matrix-result", json.loads((matrix / "matrix.json").read_text()), "matrix.json")
    progress = (matrix / "progress.jsonl").read_text().splitlines()
    assert len(progress) == 4
    for line in progress:
        assert_valid("progress", json.loads(line), "progress.jsonl")
    runs = sorted((matrix / "cells").iterdir())
    assert len(runs) == 4
    metric_rows = 0
    for run in runs:
        assert_valid("manifest", json.loads((run / "manifest.json").read_text()), f"{run.name}/manifest.json")
        assert_valid("summary", json.loads((run / "summary.json").read_text()), f"{run.name}/summary.json")
        sessions = (run / "sessions.jsonl").read_text().splitlines()
        assert len(sessions) == 4
        for line in sessions:
            assert_valid("session", json.loads(line), f"{run.name}/sessions.jsonl")
        with open(run / "metrics.csv", newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                typed = {**row, "elapsed_s": float(row["elapsed_s"]), "value": float(row["value"])}
                assert_valid("metrics", typed, f"{run.name}/metrics.csv")
                metric_rows += 1
    assert metric_rows > 0
