"""The matrix spec: a validated model of the YAML file, and its loader that names the field and line of
any error.

Strings in deployments and levels may use `${name}` variables (a bare `$VAR` is left to the shell):
those declared under `variables:` (overridable with `--var name=value`; the value `auto` means a
fresh free port for every cell) and the built-ins of BUILTIN_VARIABLES.
"""

from __future__ import annotations

import math
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from repro.errors import (
    UniqueKeyLoader,
    UsageError,
    describe_validation_error,
    load_yaml,
    yaml_lines,
)
from repro.run.options import STRING_OR_LIST, RunOptions
from repro.procs.logcap import DEFAULT_MAX_BYTES
from repro.store.conditions import ConditionError, validate

BUILTIN_VARIABLES = ("python", "flags", "cell", "replicate", "run_seed", "log_dir")
"""Set by the harness per cell: the Python running repro, the cell's shell-quoted flags, the cell name,
the replicate number, a per-run seed (design seed, cell and replicate), and the cell's log directory."""

AUTO = "auto"
"""A variable with this value gets a fresh free port for every cell."""

LOAD_SET_BY_MATRIX = ("base_url", "out")
"""`repro run` options the matrix sets per cell; a spec must not set them."""
LOAD_NOT_IN_MATRIX = ("executor", "ray_address", "worker_resources")
"""`repro run` options that place a run's workers on a Ray cluster: a cell's load runs beside its deployment
(local `workers` are fine), and `repro matrix --executor ray` is what places cells on a cluster."""


MAX_RUNS = 10_000
"""Most runs (cells x replicates) a matrix plans: each is a deployment and a load, minutes at least."""


class Template(string.Template):
    """`${name}` only: a bare `$VAR`, `$!` or `$(...)` in a shell command is left for the shell.
    `$${VAR}` passes a literal `${VAR}` through."""

    pattern = r"""
    \$(?:
      (?P<escaped>\$(?=\{)) |
      (?P<named>(?!x)x) |
      \{(?P<braced>[_a-zA-Z][_a-zA-Z0-9]*)\} |
      (?P<invalid>(?!x)x)
    )
    """


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _split_flags(value: Any) -> Any:
    return shlex.split(value) if isinstance(value, str) else value


def confirmed_value(info: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(present, value) of a `confirm` key in a server's configuration: the key itself, or a dotted path."""
    if key in info:
        return True, info[key]
    node: Any = info
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


class Level(_Model):
    """One level of a factor: what it changes in the deployment and what `/server_info` must then show."""

    flags: Annotated[list[str], WithJsonSchema(STRING_OR_LIST)] = Field(default_factory=list)
    """Server flags added to every process that takes feature flags (a string is split like a shell)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables set on the processes this level applies to."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Variables this level sets, e.g. a patched `image`."""
    command: str | None = None
    """Replaces the command of the processes this level applies to (a patched build)."""
    deployment: str | None = None
    """Selects one of the spec's named `deployments` (e.g. a PD topology)."""
    processes: list[str] | None = None
    """The processes this level's flags, env and command apply to; default every feature process."""
    confirm: dict[str, Any] = Field(default_factory=dict)
    """Keys `/server_info` must show on every process this level applies to (dotted paths allowed)."""
    exercise: Annotated[list[str], WithJsonSchema(STRING_OR_LIST)] = Field(default_factory=list)
    """Conditions on the cell's metrics that show the level acted, e.g. `host_load_back_tokens > 0` or
    `delta(sglang:evicted_tokens_total) > 0`; a cell where one does not hold is left out of the analysis."""

    _split = field_validator("flags", mode="before")(_split_flags)

    @field_validator("exercise", mode="before")
    @classmethod
    def _conditions(cls, value: Any) -> list[str]:
        try:
            return validate(value)
        except ConditionError as err:
            raise ValueError(str(err)) from None


class Factor(_Model):
    label: str | None = None
    """How reports name the factor (default: its key)."""
    levels: dict[str, Level | None] = Field(min_length=2)
    """In order; the first is the baseline unless `design.baseline` says otherwise. An empty level is allowed."""

    @field_validator("levels")
    @classmethod
    def _empty_levels(cls, value: dict[str, Level | None]) -> dict[str, Level | None]:
        return {name: level or Level() for name, level in value.items()}

    def level(self, name: str) -> Level:
        level = self.levels[name]
        assert level is not None
        return level


class Readiness(_Model):
    timeout: float = Field(1800.0, gt=0)
    """Seconds to wait for every process (cold starts of real servers take many minutes)."""
    interval: float = Field(5.0, gt=0)
    """Seconds between two readiness polls."""


class ProcessSpec(_Model):
    """One launched process of a deployment."""

    name: str = Field(min_length=1)
    """The process's name: in logs/<cell>/<name>.log, in `processes` of a level, in the report."""
    command: str = Field(min_length=1)
    """Shell command that starts it; `${flags}` is where a level's flags go (else they are appended)."""
    port: str | int | None = None
    """Used for the default URLs; may be a `${variable}`."""
    ready_url: str | None = None
    """Default `http://127.0.0.1:<port>/health`."""
    info_url: str | None = None
    """Where to read the configuration; default `http://127.0.0.1:<port>/server_info`; a Prometheus `/metrics`
    gives its `*_info` labels (vLLM's `vllm:cache_config_info`); empty to skip."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of this process."""
    features: bool = True
    """Whether factor levels apply here (false for a router)."""
    confirm: dict[str, Any] = Field(default_factory=dict)
    """Keys `/server_info` must show on this process in every cell (e.g. disaggregation_mode: prefill)."""


class ExternalSpec(_Model):
    """A deployment the harness does not start: hooks set each cell up and tear it down."""

    setup: str = Field(min_length=1)
    """Shell command run before each cell; the cell's flags are in `${flags}` and in REPRO_FLAGS."""
    teardown: str = Field(min_length=1)
    """Shell command run after each cell, also when it failed."""
    hook_timeout: float = Field(1800.0, gt=0)
    """Seconds each hook may take."""
    url: str
    """Base URL the load goes to (without /v1)."""
    ready_url: str | None = None
    """Polled until it answers 200 before the load starts; default `<url>/health`."""
    info_url: str | None = None
    """Where to read the configuration; default `<url>/server_info`; empty to skip."""


class Deployment(_Model):
    """How to launch one cell: one `command`, several `processes`, or `external` hooks."""

    command: str | None = None
    """One server process (named `server`): its shell command."""
    port: str | int | None = None
    """With `command`: the port its default URLs use; may be a `${variable}`."""
    ready_url: str | None = None
    """With `command`: default `http://127.0.0.1:<port>/health`."""
    info_url: str | None = None
    """With `command`: default `http://127.0.0.1:<port>/server_info`; empty to skip."""
    processes: list[ProcessSpec] | None = None
    """Several processes (a PD pair and its router), started in order and stopped in reverse."""
    external: ExternalSpec | None = None
    """A deployment started and stopped by your own hooks."""
    url: str | None = None
    """Base URL the load goes to (without /v1); default the last process's port."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of every process."""
    ready: Readiness = Field(default_factory=Readiness)
    """How long to wait for the processes to answer their ready URLs."""
    stop_timeout: float = Field(30.0, gt=0)
    """Seconds between SIGTERM and SIGKILL at teardown."""
    log_max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=4096)
    """Cap on each launched process's log: the first half is kept, then the latest output rotates."""

    @model_validator(mode="after")
    def _one_form(self) -> "Deployment":
        forms = [name for name in ("command", "processes", "external") if getattr(self, name) is not None]
        if len(forms) != 1:
            raise ValueError(f"give exactly one of command, processes, external (got {forms or 'none'})")
        if self.processes is not None:
            names = [p.name for p in self.processes]
            if len(set(names)) != len(names):
                raise ValueError(f"process names must be unique, got {names}")
            if not self.processes:
                raise ValueError("processes must list at least one process")
        return self

    def process_specs(self) -> list[ProcessSpec]:
        """The launched processes (none for external); a single `command` is one process named server."""
        if self.command is not None:
            return [
                ProcessSpec(
                    name="server",
                    command=self.command,
                    port=self.port,
                    ready_url=self.ready_url,
                    info_url=self.info_url,
                )
            ]
        return list(self.processes or [])


Correction = Literal["holm", "fdr_bh", "none"]


class DesignSpec(_Model):
    type: Literal["full", "half", "list"] = "full"
    """`full`: every combination of levels; `half`: a half fraction (two-level factors); `list`: `cells`."""
    cells: list[dict[str, str]] | None = None
    """For `type: list`: each cell as {factor: level}."""
    replicates: int = Field(1, ge=1)
    """Launches of each cell; their sessions are pooled."""
    seed: int = 0
    """Seeds the run order (and the per-run `${run_seed}`)."""
    baseline: dict[str, str] | None = None
    """The reference level per factor; default each factor's first level."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Significance level of each factor's test, after the correction."""
    correction: Correction = "holm"
    """Multiple-comparison correction across the factors' tests: Holm, Benjamini-Hochberg, or none."""
    min_completed: int = Field(20, ge=0)
    """Completed sessions per arm below which a factor's verdict is inconclusive."""
    max_timeout_fraction: float = Field(0.2, ge=0, le=1)
    """Share of timed-out sessions above which an arm is inconclusive: a timeout proves neither clean nor corrupt."""
    detect: float = Field(0.10, gt=0, lt=1)
    """The difference in corruption rate whose power a "no detectable effect" verdict states."""
    margin: float = Field(0.05, gt=0, lt=1)
    """δ: a factor whose whole difference interval lies within ±margin is "practically equivalent"
    (TOST at alpha, Bonferroni over the factors; repro.stats.equivalence)."""
    sequential: bool = False
    """Run in rounds (one run per still-needed cell each), look after each, stop when every factor is
    decided; `replicates` is the cap on rounds and each look tests at alpha / replicates (repro.matrix.sequential)."""


class ResourcesSpec(_Model):
    """What each run asks of the cluster under `--executor ray` (ignored by the local executor).

    Names are Ray's: CPU, GPU, memory, or a custom resource a node was started with (`--resources`).
    """

    run: dict[str, NonNegativeFloat] = Field(default_factory=lambda: {"CPU": 1})
    """Asked by every run."""
    levels: dict[str, dict[str, dict[str, NonNegativeFloat]]] = Field(default_factory=dict)
    """{factor: {level: {resource: amount}}}: added for the runs of cells at that level (pins cells to nodes)."""

    def for_cell(self, cell: dict[str, str]) -> dict[str, float]:
        """The resources one run of `cell` asks for: `run`, plus each of its levels' (summed)."""
        asked = dict(self.run)
        for factor, level in cell.items():
            for name, amount in self.levels.get(factor, {}).get(level, {}).items():
                asked[name] = asked.get(name, 0.0) + amount
        return asked


class MatrixSpec(_Model):
    name: str = Field(min_length=1)
    """Names the matrix directory and the report."""
    variables: dict[str, str | int | float] = Field(default_factory=dict)
    """`${name}` values for commands and flags; `--var name=value` overrides; `auto` is a fresh free port per cell."""
    factors: dict[str, Factor] = Field(min_length=1)
    """The server features under test, each with its levels."""
    deployment: Deployment | None = None
    """How to launch a cell (or `deployments`, several named ones that levels select)."""
    deployments: dict[str, Deployment] | None = None
    """Named deployments that factor levels select; the first is used when no level selects one."""
    load: dict[str, Any] = Field(default_factory=dict)
    """The options of `repro run` (without base_url and out, which the matrix sets per cell)."""
    design: DesignSpec = Field(default_factory=DesignSpec)
    """Which cells run, how often, in what order, and how the analysis decides."""
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    """What each run asks of a Ray cluster (`--executor ray`); the local executor ignores it."""

    @field_validator("variables")
    @classmethod
    def _variable_names(cls, value: dict[str, Any]) -> dict[str, str]:
        for name in value:
            if not name.isidentifier():
                raise ValueError(f"variable name {name!r} is not an identifier")
            if name in BUILTIN_VARIABLES:
                raise ValueError(f"variable {name!r} is set by the harness; choose another name")
        return {name: str(v) for name, v in value.items()}

    @field_validator("load")
    @classmethod
    def _load_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in LOAD_SET_BY_MATRIX:
            if key in value:
                raise ValueError(f"{key} is set by the matrix per cell; remove it from load")
        for key in LOAD_NOT_IN_MATRIX:
            if key in value:
                raise ValueError(f"{key}: a cell's load runs beside its deployment; "
                                 "place cells on a cluster with `repro matrix --executor ray`")
        return value

    def problems(self) -> list[tuple[tuple, str]]:
        """Cross-field mistakes, each with the `loc` of the field at fault (for its line in the file)."""
        found: list[tuple[tuple, str]] = []
        if (self.deployment is None) == (self.deployments is None):
            found.append(((), "give exactly one of deployment, deployments"))
            return found
        deployments = self.named_deployments()
        if not deployments:
            found.append((("deployments",), "name at least one deployment"))
        processes = {p.name for d in deployments.values() for p in d.process_specs()}
        for fname, factor in self.factors.items():
            for lname, level in factor.levels.items():
                assert level is not None
                where = ("factors", fname, "levels", lname)
                if level.deployment is not None and level.deployment not in deployments:
                    found.append(
                        (
                            (*where, "deployment"),
                            f"no deployment named {level.deployment!r} (have {sorted(deployments)})",
                        )
                    )
                unknown = sorted(set(level.processes or ()) - processes)
                if unknown:
                    found.append(((*where, "processes"), f"no process named {unknown[0]!r}"))
        for fname, levels in self.resources.levels.items():
            where = ("resources", "levels", fname)
            if fname not in self.factors:
                found.append((where, f"no factor named {fname!r}"))
                continue
            unknown = sorted(set(levels) - set(self.factors[fname].levels))
            if unknown:
                found.append(((*where, unknown[0]), f"factor {fname!r} has no level {unknown[0]!r}"))
        found += self._design_problems()
        found += self._variable_problems()
        return found

    def _design_problems(self) -> list[tuple[tuple, str]]:
        design = self.design
        found = self._level_problems(("design", "baseline"), design.baseline or {}, complete=False)
        if design.type == "list":
            if not design.cells:
                found.append((("design", "type"), "a `list` design needs design.cells"))
            for index, cell in enumerate(design.cells or []):
                found += self._level_problems(("design", "cells", index), cell, complete=True)
        elif design.cells is not None:
            found.append((("design", "cells"), "only a `list` design takes cells"))
        combinations = math.prod(len(factor.levels) for factor in self.factors.values())
        cells = len(design.cells or []) if design.type == "list" else combinations // (2 if design.type == "half" else 1)
        if cells * design.replicates > MAX_RUNS:
            # Counted, never built: 2^20 cells or 10^8 replicates must be refused before a plan lists them.
            found.append((("design",), f"{cells} cells x {design.replicates} replicates is {cells * design.replicates} "
                                       f"runs; a matrix runs at most {MAX_RUNS}"))
        if design.type == "half":
            many = [f for f, factor in self.factors.items() if len(factor.levels) != 2]
            if len(self.factors) < 3:
                found.append((("design", "type"), "a half fraction needs at least 3 factors"))
            elif many:
                found.append((("design", "type"), f"a half fraction needs two-level factors; {many[0]!r} has more"))
        return found

    def _level_problems(self, where: tuple, cell: dict[str, str], *, complete: bool) -> list[tuple[tuple, str]]:
        found: list[tuple[tuple, str]] = []
        for factor, level in cell.items():
            if factor not in self.factors:
                found.append(((*where, factor), f"no factor named {factor!r}"))
            elif level not in self.factors[factor].levels:
                found.append(((*where, factor), f"factor {factor!r} has no level {level!r}"))
        missing = [f for f in self.factors if f not in cell]
        if complete and missing:
            found.append((where, f"no level given for factor {missing[0]!r}"))
        return found

    def _variable_problems(self) -> list[tuple[tuple, str]]:
        known = set(self.variables) | set(BUILTIN_VARIABLES)
        for factor in self.factors.values():
            for level in factor.levels.values():
                assert level is not None
                known |= set(level.vars)
        found: list[tuple[tuple, str]] = []
        for where, text in self._templates():
            unknown = sorted(set(Template(text).get_identifiers()) - known)
            if unknown:
                found.append((where, f"unknown variable {unknown[0]!r} (declare it under variables)"))
        return found

    def _templates(self) -> list[tuple[tuple, str]]:
        found: list[tuple[tuple, str]] = []

        def add(where: tuple, value: object) -> None:
            if isinstance(value, str):
                found.append((where, value))
            elif isinstance(value, dict):
                for key, item in value.items():
                    add((*where, key), item)
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    add((*where, index), item)

        if self.deployment is not None:
            add(("deployment",), self.deployment.model_dump(exclude_none=True, exclude_defaults=True))
        for name, deployment in (self.deployments or {}).items():
            add(("deployments", name), deployment.model_dump(exclude_none=True, exclude_defaults=True))
        for fname, factor in self.factors.items():
            for lname, level in factor.levels.items():
                assert level is not None
                add(("factors", fname, "levels", lname), level.model_dump(exclude={"confirm"}, exclude_none=True))
        return found

    def named_deployments(self) -> dict[str, Deployment]:
        if self.deployment is not None:
            return {"default": self.deployment}
        return dict(self.deployments or {})

    def baseline(self) -> dict[str, str]:
        """The reference level of every factor."""
        chosen = self.design.baseline or {}
        return {name: chosen.get(name, next(iter(factor.levels))) for name, factor in self.factors.items()}

    def label(self, factor: str) -> str:
        return self.factors[factor].label or factor


class SpecLoader(UniqueKeyLoader):
    """YAML 1.2 booleans: only true/false. Under YAML 1.1 a level named `off` or `on` would silently
    become a boolean key. A key given twice is an error."""


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_assignments(items: list[str]) -> dict[str, str]:
    """`--var name=value` options into a dict; UsageError on a malformed one."""
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UsageError(f"--var {item!r}: expected NAME=VALUE")
        result[name.strip()] = value
    return result


@dataclass(frozen=True)
class SpecFile:
    """A matrix spec as read from its file: the validated spec, and the text and line of every field it came
    from, read once for every later check that names a spec line (repro.matrix.preflight)."""

    spec: MatrixSpec
    source: Path
    text: str
    lines: dict[tuple, int]

    def line(self, loc: tuple) -> str:
        """`spec.yaml:LINE` of the field at `loc`, or of its nearest parent the file has."""
        return spec_line(self.source, self.lines, loc)


def load_spec(path: Path | str, overrides: dict[str, str] | None = None, *, files: bool = True) -> MatrixSpec:
    """Read and validate a matrix spec; `overrides` replace declared variables (from `--var`). `files`: refuse
    a workload or a relative path that does not exist (not for a spec read back only to analyse its cells)."""
    return read_spec(path, overrides, files=files).spec


def read_spec(path: Path | str, overrides: dict[str, str] | None = None, *, files: bool = True) -> SpecFile:
    """load_spec, keeping the spec's text and lines for the checks that follow."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{source}: cannot read matrix spec: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{source}: not UTF-8 text") from None
    data = load_yaml(text, source=str(source), loader=SpecLoader)
    lines = yaml_lines(text, SpecLoader)
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a matrix spec is a YAML mapping (name, factors, deployment, load, design)")
    try:
        spec = MatrixSpec.model_validate(data)
    except ValidationError as err:
        raise UsageError(describe_validation_error(err, source=str(source), lines=lines)) from None
    problems = spec.problems()
    if problems:
        loc, message = problems[0]
        raise UsageError(f"{spec_line(source, lines, loc)}: {'.'.join(map(str, loc)) or '(top level)'}: {message}")
    _resolve_paths(spec, source, lines, files=files)
    _validate_load(spec, source, lines)
    if overrides:
        unknown = sorted(set(overrides) - set(spec.variables))
        if unknown:
            raise UsageError(
                f"--var {unknown[0]}: not a variable of {source} (declared: {', '.join(spec.variables) or 'none'})"
            )
        spec = spec.model_copy(update={"variables": {**spec.variables, **overrides}})
    return SpecFile(spec=spec, source=source, text=text, lines=lines)


def is_relative_path(value: str) -> bool:
    """Whether a variable's value names a file relative to the spec (`./x`, `../x`)."""
    return value.startswith(("./", "../")) or value in (".", "..")


def _resolve_paths(spec: MatrixSpec, source: Path, lines: dict[tuple, int], *, files: bool) -> None:
    """Make the workload and every variable that names a relative path (`./x`, `../x`) absolute from the
    spec's own directory, so a matrix means the same files from any working directory; a named file
    that does not exist is refused here, with its line, before anything starts."""
    base = source.resolve().parent
    workload = spec.load.get("workload")
    if isinstance(workload, str) and not Path(workload).is_absolute():
        spec.load["workload"] = str((base / workload).resolve())
    if files and isinstance(workload, str) and not Path(spec.load["workload"]).is_file():
        loc = ("load", "workload")
        raise UsageError(f"{spec_line(source, lines, loc)}: load.workload: {spec.load['workload']} is not a file "
                         f"(a relative path is read from the spec's directory, {base})")
    named: list[tuple[tuple, dict[str, str]]] = [(("variables",), spec.variables)]
    for fname, factor in spec.factors.items():
        for lname, level in factor.levels.items():
            assert level is not None
            named.append((("factors", fname, "levels", lname, "vars"), level.vars))
    for where, values in named:
        for name, value in values.items():
            if not is_relative_path(value):
                continue
            path = (base / value).resolve()
            if files and not path.exists():
                loc = (*where, name)
                raise UsageError(f"{spec_line(source, lines, loc)}: {'.'.join(map(str, loc))}: {value} does not exist "
                                 f"(a relative path is read from the spec's directory, {base})")
            values[name] = str(path)


def spec_line(source: Path, lines: dict[tuple, int], loc: tuple) -> str:
    """`spec.yaml:LINE` of the field at `loc`, or of its nearest parent the file has."""
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return f"{source}:{lines[loc[:cut]]}"
    return str(source)


def _validate_load(spec: MatrixSpec, source: Path, lines: dict[tuple, int]) -> None:

    try:
        RunOptions.model_validate({**spec.load, "base_url": "http://127.0.0.1:1/v1"})
    except ValidationError as err:
        shifted = {loc[1:]: line for loc, line in lines.items() if loc[:1] == ("load",)}
        message = describe_validation_error(err, source=str(source), lines=shifted)
        where, _, rest = message.partition(": ")
        raise UsageError(f"{where}: load.{rest}") from None
