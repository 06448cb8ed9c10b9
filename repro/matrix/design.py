"""The experimental design: which cells to run (full factorial, a listed subset, the 2^(k-1) half
fraction) and in what order (randomised with a seed, replicates interleaved across server restarts).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from repro.matrix.spec import MatrixSpec
from repro.store.paths import slug


@dataclass(frozen=True)
class Cell:
    """One combination of factor levels, in the spec's factor order."""

    levels: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return slug("_".join(f"{factor}-{level}" for factor, level in self.levels))

    def level(self, factor: str) -> str:
        return dict(self.levels)[factor]

    def as_dict(self) -> dict[str, str]:
        return dict(self.levels)


@dataclass(frozen=True)
class PlannedRun:
    """One launch of one cell: a replicate, at its place in the randomised order."""

    cell: Cell
    replicate: int
    """1-based."""
    order: int
    """0-based position in the run order."""

    @property
    def key(self) -> str:
        """The run directory's name under cells/."""
        return f"{self.cell.name}-r{self.replicate}"


def _cell(spec: MatrixSpec, chosen: dict[str, str]) -> Cell:
    return Cell(tuple((factor, chosen[factor]) for factor in spec.factors))


def half_fraction(spec: MatrixSpec) -> list[Cell]:
    """The half of the 2^k two-level factorial that contains the baseline cell (defining relation
    I = ±ABC…: the product of ±1 codes is constant), so main effects are estimable with half the cells."""
    baseline = spec.baseline()
    factors = list(spec.factors)
    keep = []
    for combo in itertools.product(*(list(spec.factors[f].levels) for f in factors)):
        off_baseline = sum(level != baseline[f] for f, level in zip(factors, combo))
        if off_baseline % 2 == 0:
            keep.append(_cell(spec, dict(zip(factors, combo))))
    return keep


def cells(spec: MatrixSpec) -> list[Cell]:
    """Every cell of the design, baseline first, then in factorial order."""
    design = spec.design
    if design.type == "list":
        found = [_cell(spec, chosen) for chosen in design.cells or []]
    elif design.type == "half":
        found = half_fraction(spec)
    else:
        names = list(spec.factors)
        found = [
            _cell(spec, dict(zip(names, combo)))
            for combo in itertools.product(*(list(spec.factors[f].levels) for f in names))
        ]
    unique = list(dict.fromkeys(found))
    base = _cell(spec, spec.baseline())
    if base in unique:
        unique.remove(base)
        unique.insert(0, base)
    return unique


def run_order(design_cells: list[Cell], replicates: int, seed: int) -> list[PlannedRun]:
    """Replicate blocks in turn, each block every cell once in its own random order: a drift over the
    hours of a matrix then spreads over all cells instead of masquerading as one factor's effect."""
    rng = random.Random(seed)
    runs: list[PlannedRun] = []
    for replicate in range(1, replicates + 1):
        block = list(design_cells)
        rng.shuffle(block)
        for cell in block:
            runs.append(PlannedRun(cell=cell, replicate=replicate, order=len(runs)))
    return runs


def plan(spec: MatrixSpec) -> list[PlannedRun]:
    """The matrix's runs in the order they are to be launched."""
    return run_order(cells(spec), spec.design.replicates, spec.design.seed)
