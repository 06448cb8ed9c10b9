"""Matrix specs and designs: validation with the field and line named, variables, cells, fractions, order."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.errors import UsageError
from repro.matrix.design import cells, half_fraction, plan, run_order
from repro.matrix.spec import MatrixSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
name: t
variables:
  port: auto
factors:
  hicache:
    levels:
      off: {}
      on:
        flags: --enable-hierarchical-cache
        confirm: {enable_hierarchical_cache: true}
  index_k:
    levels:
      fp8: {flags: --index-k-dtype fp8}
      bf16: {flags: [--index-k-dtype, bf16]}
deployment:
  command: ${python} -m repro.sim serve --port ${port}
  port: ${port}
load:
  sessions: 4
design:
  replicates: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as info:
        load_spec(write(tmp_path, text))
    assert info.value.exit_code == 2
    return str(info.value)


def test_shipped_matrices_validate() -> None:
    names = sorted(p.name for p in (ROOT / "matrices").glob("*.yaml"))
    assert {"hicache_bf16.yaml", "full_factorial.yaml", "sim_hicache_bf16.yaml", "sim_pd_hicache.yaml"} <= set(names)
    for name in names:
        spec = load_spec(ROOT / "matrices" / name)
        assert plan(spec), name


def test_on_and_off_stay_level_names_not_booleans(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE))
    assert list(spec.factors["hicache"].levels) == ["off", "on"]
    assert spec.factors["hicache"].level("on").confirm == {"enable_hierarchical_cache": True}
    assert spec.factors["index_k"].level("fp8").flags == ["--index-k-dtype", "fp8"]


def test_type_error_names_field_and_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("  replicates: 2", "  replicates: many"))
    assert message.startswith(f"{tmp_path / 'm.yaml'}:21: design.replicates:")


def test_unknown_key_names_its_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("      off: {}", "      off: {flagz: [-x]}"))
    assert ":7: factors.hicache.levels.off.flagz:" in message


def test_bad_load_option_is_named_under_load(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("  sessions: 4", "  sessions: -1"))
    assert ":19: load.sessions:" in message


def test_load_must_not_set_what_the_matrix_sets(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("  sessions: 4", "  sessions: 4\n  base_url: http://x/v1"))
    assert "load" in message and "base_url" in message


@pytest.mark.parametrize("line", ["executor: ray", "ray_address: auto", "worker_resources: '{\"CPU\": 1}'"])
def test_load_must_not_place_its_workers_on_a_cluster(tmp_path: Path, line: str) -> None:
    message = error_of(tmp_path, BASE.replace("  sessions: 4", f"  sessions: 4\n  workers: 2\n  {line}"))
    assert f"load: {line.split(':')[0]}: a cell's load runs beside its deployment" in message
    assert "repro matrix --executor ray" in message


def test_unknown_variable_is_named_with_its_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("--port ${port}", "--port ${prot}"))
    assert ":16: deployment.command: unknown variable 'prot'" in message


def test_cross_field_errors_name_field_and_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE.replace("design:\n", "design:\n  baseline: {hicache: maybe}\n"))
    assert ":21: design.baseline.hicache: factor 'hicache' has no level 'maybe'" in message
    message = error_of(tmp_path, BASE.replace("      off: {}", "      off: {deployment: pd}"))
    assert ":7: factors.hicache.levels.off.deployment: no deployment named 'pd'" in message


def test_deployment_needs_exactly_one_form(tmp_path: Path) -> None:
    external = "  port: ${port}\n  external: {setup: a, teardown: b, url: http://h}\n"
    message = error_of(tmp_path, BASE.replace("  port: ${port}\n", external))
    assert "deployment" in message and "exactly one of command, processes, external" in message


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    assert "not valid YAML" in error_of(tmp_path, "name: [unclosed\n")
    assert "YAML mapping" in error_of(tmp_path, "- a\n- b\n")
    with pytest.raises(UsageError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_var_overrides_only_declared_variables(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE), {"port": "31000"})
    assert spec.variables["port"] == "31000"
    with pytest.raises(UsageError, match="--var model: not a variable"):
        load_spec(write(tmp_path, BASE), {"model": "x"})


def test_full_factorial_baseline_first_and_interleaved_order(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE))
    design = cells(spec)
    assert [c.as_dict() for c in design][0] == {"hicache": "off", "index_k": "fp8"}
    assert len(design) == 4
    runs = plan(spec)
    assert len(runs) == 8
    assert {r.replicate for r in runs[:4]} == {1} and {r.replicate for r in runs[4:]} == {2}
    assert {r.cell for r in runs[:4]} == set(design)
    assert [r.key for r in plan(spec)] == [r.key for r in runs]


def test_list_design(tmp_path: Path) -> None:
    listed = "design:\n  type: list\n  cells:\n    - {hicache: off, index_k: fp8}\n    - {hicache: on, index_k: bf16}\n"
    names = [c.name for c in cells(load_spec(write(tmp_path, BASE.replace("design:\n", listed))))]
    assert names == ["hicache-off_index_k-fp8", "hicache-on_index_k-bf16"]
    bad = BASE.replace("design:\n", "design:\n  type: list\n  cells:\n    - {hicache: off}\n")
    assert "design.cells.0: no level given for factor 'index_k'" in error_of(tmp_path, bad)


def _two_level_spec(k: int, *, half: bool = True) -> MatrixSpec:
    return MatrixSpec.model_validate(
        {
            "name": "h",
            "factors": {f"f{i}": {"levels": {"a": {}, "b": {}}} for i in range(k)},
            "deployment": {"command": "true", "port": 1},
            "design": {"type": "half" if half else "full"},
        }
    )


@pytest.mark.parametrize("k", [3, 4, 5])
def test_half_fraction_is_balanced_and_holds_the_baseline(k: int) -> None:
    spec = _two_level_spec(k)
    design = half_fraction(spec)
    assert len(design) == 2 ** (k - 1)
    assert design[0].as_dict() == spec.baseline()
    for i in range(k):
        assert sum(c.level(f"f{i}") == "b" for c in design) == 2 ** (k - 2)
    for i, j in itertools.combinations(range(k), 2):
        pairs = [(c.level(f"f{i}"), c.level(f"f{j}")) for c in design]
        assert all(pairs.count(p) == 2 ** (k - 3) for p in itertools.product("ab", repeat=2))


def test_half_fraction_needs_two_level_factors() -> None:
    spec = MatrixSpec.model_validate(
        {
            "name": "h",
            "factors": {"a": {"levels": {"x": {}, "y": {}, "z": {}}}, "b": {"levels": {"x": {}, "y": {}}},
                        "c": {"levels": {"x": {}, "y": {}}}},
            "deployment": {"command": "true", "port": 1},
            "design": {"type": "half"},
        }
    )
    assert spec.problems() == [(("design", "type"), "a half fraction needs two-level factors; 'a' has more")]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_run_order_is_a_seeded_interleaved_permutation(n_cells: int, replicates: int, seed: int) -> None:
    design = cells(_two_level_spec(3, half=False))[:n_cells]
    runs = run_order(design, replicates, seed)
    assert [r.order for r in runs] == list(range(n_cells * replicates))
    for block in range(replicates):
        chunk = runs[block * n_cells : (block + 1) * n_cells]
        assert sorted(c.name for c in design) == sorted(r.cell.name for r in chunk)
        assert {r.replicate for r in chunk} == {block + 1}
    assert runs == run_order(design, replicates, seed)
