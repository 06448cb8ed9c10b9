"""Before a matrix launches anything: paths resolve from the spec's directory, every cell is checked with the
spec line at fault, `docker run` commands are labelled, and `--dry-run` prints each run as it would launch."""

from __future__ import annotations

import io
import shutil
import textwrap
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.matrix.dryrun import dry_run
from repro.matrix.preflight import preflight
from repro.matrix.spec import load_spec, read_spec
from repro.procs.containers import LABEL, in_containers, labelled

ROOT = Path(__file__).resolve().parent.parent

SPEC = """\
name: t
variables:
  port: "30000"
  prompts: ./prompts.txt
factors:
  hicache:
    levels:
      off: {}
      on: {flags: --enable-hierarchical-cache, confirm: {enable_hierarchical_cache: true}}
deployment:
  command: ${python} -m repro.sim serve --port ${port} --prompts ${prompts}
  port: ${port}
load:
  sessions: 4
"""


def write(directory: Path, text: str, name: str = "m.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_relative_variable_and_workload_resolve_from_the_spec_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = tmp_path / "specs"
    (specs).mkdir()
    (specs / "prompts.txt").write_text("x", encoding="utf-8")
    shutil.copy(ROOT / "experiments" / "agentic_coding.yaml", specs / "w.yaml")
    path = write(specs, SPEC + "  workload: w.yaml\n")
    monkeypatch.chdir(tmp_path)  # elsewhere: the spec's own directory decides
    spec = load_spec(path)
    assert spec.variables["prompts"] == str(specs / "prompts.txt")
    assert spec.load["workload"] == str(specs / "w.yaml")


def test_a_missing_relative_file_is_refused_with_its_spec_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_spec(write(tmp_path, SPEC))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'm.yaml'}:4: variables.prompts: ./prompts.txt does not exist")
    assert "\n" not in message


def test_a_missing_workload_is_refused_with_its_spec_line(tmp_path: Path) -> None:
    (tmp_path / "prompts.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UsageError, match=r"m\.yaml:15: load\.workload: .*nothere\.yaml is not a file"):
        load_spec(write(tmp_path, SPEC + "  workload: ../nothere.yaml\n"))


def test_a_workload_that_does_not_load_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "prompts.txt").write_text("x", encoding="utf-8")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    path = write(tmp_path, SPEC + "  workload: bad.yaml\n")
    with pytest.raises(UsageError) as info:
        preflight(read_spec(path))
    assert str(info.value).startswith(f"{path}:15: load.workload: ")


def test_a_program_not_on_path_is_refused_with_its_spec_line(tmp_path: Path) -> None:
    (tmp_path / "prompts.txt").write_text("x", encoding="utf-8")
    path = write(tmp_path, SPEC.replace("${python} -m repro.sim serve", "no-such-server-binary"))
    with pytest.raises(UsageError, match=r"m\.yaml:10: deployment: server: 'no-such-server-binary' is not found on PATH"):
        preflight(read_spec(path))
    preflight(read_spec(path), programs=False)  # cells placed on other nodes: their PATH, not ours


def test_a_cell_whose_levels_select_two_deployments_is_refused_before_launch(tmp_path: Path) -> None:
    text = """\
    name: t
    factors:
      a:
        levels:
          x: {deployment: one}
          y: {}
      b:
        levels:
          x: {deployment: two}
          y: {}
    deployments:
      one: {command: "true", port: 1}
      two: {command: "true", port: 2}
    """
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match=r"m\.yaml:12: cell a-x_b-x: levels select different deployments"):
        preflight(read_spec(path))


def test_the_sequential_page_example_works_from_the_repository_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/sequential.md: the shipped simulator matrix with `sequential: true`, saved at the repository root.
    text = (ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8")
    write(tmp_path, text.replace("  min_completed: 40\n", "  min_completed: 40\n  sequential: true\n"),
          name="sim_sequential.yaml")
    monkeypatch.chdir(tmp_path)
    source = read_spec(Path("sim_sequential.yaml"))
    preflight(source)
    assert source.spec.design.sequential


def test_docker_run_is_labelled_and_nothing_else_is() -> None:
    argv, label = labelled(["docker", "run", "--rm", "img", "serve"], "abc", 7)
    assert argv == ["docker", "run", "--label", f"{LABEL}=abc", "--label", "repro.owner=7", "--rm", "img", "serve"]
    assert label == "abc"
    argv, _ = labelled(["/usr/bin/docker", "--context", "gpu", "container", "run", "img"], "t", 1)
    assert argv[:6] == ["/usr/bin/docker", "--context", "gpu", "container", "run", "--label"]
    for other in (["docker", "ps"], ["python", "-m", "docker", "run"], ["bash", "-c", "docker run img"]):
        assert labelled(other, "t", 1) == (other, None)


def test_dry_run_masks_secrets_and_shows_what_resume_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-very-secret-value")
    (tmp_path / "prompts.txt").write_text("x", encoding="utf-8")
    text = SPEC.replace("  port: ${port}\n", "  port: ${port}\n  env: {HF_TOKEN: hf_abcdefgh, MODE: fast}\n")
    text = text.replace("variables:\n", "variables:\n  api_token: tok-123456\n")
    text = text.replace("--port ${port}", "--port ${port} --token ${api_token}")
    path = write(tmp_path, text + "  api_key_env: MY_KEY\n")
    out = io.StringIO()
    assert dry_run(path, out=tmp_path / "m", stream=out) == 0
    shown = out.getvalue()
    assert "hf_abcdefgh" not in shown and "tok-123456" not in shown and "sk-very-secret" not in shown
    assert "HF_TOKEN=****" in shown and "MODE=fast" in shown and "--token **** " in shown
    assert "api key: read from $MY_KEY (set here" in shown
    assert "confirm: GET http://127.0.0.1:30000/server_info must show enable_hierarchical_cache = True" in shown
    assert "health: GET http://127.0.0.1:30000/health until it answers 200" in shown
    assert not (tmp_path / "m").exists()
    with pytest.raises(UsageError, match="not a matrix directory"):
        dry_run(path, out=tmp_path, resume=True, stream=io.StringIO())


def test_a_port_holder_inside_the_launched_container_is_recognised_by_its_cgroup() -> None:
    cid = "3f2a" * 16
    assert in_containers(f"0::/system.slice/docker-{cid}.scope\n", [cid])
    assert in_containers(f"12:memory:/docker/{cid}\n", [cid])
    assert not in_containers("0::/user.slice/user-0.slice/session-1.scope\n", [cid])
    assert not in_containers(f"0::/docker/{cid}\n", [])


def test_a_spec_read_back_for_analysis_needs_no_files(tmp_path: Path) -> None:
    # `repro reanalyse` reads the spec.yaml copy in a matrix directory, where neither file is beside it.
    spec = load_spec(write(tmp_path, SPEC + "  workload: ../elsewhere.yaml\n"), files=False)
    assert spec.variables["prompts"] == str(tmp_path / "prompts.txt")
    assert spec.load["workload"] == str(tmp_path.parent / "elsewhere.yaml")
