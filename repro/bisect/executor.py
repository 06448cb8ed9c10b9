"""Where a bisection's probes run: one after another in this process (`LocalProbes`, the default), or
each as a Ray task placed by the resources it asks for (`RayProbes`, `--executor ray`), several at once
when the search has independent probes (`--parallel K`).

A Ray task runs the whole probe (checkout, build, deployment start, load rounds, stop) in a scratch
directory on its node and returns its result, where it ran and the probe directory as one archive,
which the driver unpacks into the bisect directory, so the journal, the reports and `--resume` are the
local executor's. A task that ends without a result (its node died) or that no live node can take is
a "lost" probe: no evidence about its target. Ctrl-C cancels every task (repro.cluster.rayutil.cancel).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from rich.console import Console
from rich.text import Text

from repro.bisect.journal import Journal, probe_name
from repro.bisect.posterior import ProbePlan
from repro.bisect.probe import ProbeJob, ProbeResult, describe, run_job
from repro.errors import ReproError, UsageError
from repro.cluster.node import describe as describe_node
from repro.cluster.node import where
from repro.cluster.rayutil import (
    absolute_workload,
    as_completed,
    asked_resources,
    check_executor,
    connected,
    pack,
    scratch,
    submit,
    unpack,
)


@dataclass(frozen=True)
class NumberedProbe:
    """A chosen probe with its number, its directory's label and its sessions' seed."""

    number: int
    label: str
    job: ProbeJob
    plan: ProbePlan
    seed: int

    @property
    def name(self) -> str:
        return probe_name(self.number, self.label)


ProbeEnd = tuple[NumberedProbe, ProbeResult, "dict[str, str] | None"]
"""A probe that ended: what it was, its result, and where it ran (None: lost before it ran anywhere)."""


class ProbeExecutor(Protocol):
    def connected(self) -> contextlib.AbstractContextManager[None]:
        """Hold what the probes need for the whole search (a connection to the cluster)."""
        ...

    def run(self, probes: list[NumberedProbe], journal: Journal, load: dict[str, Any],
            console: Console) -> Iterator[ProbeEnd]:
        """Run `probes` with the `repro run` options `load`; yield each with its result and its node as it ends."""
        ...


class LocalProbes:
    """Probes one after another in this process, each in its directory of the journal."""

    @contextlib.contextmanager
    def connected(self) -> Iterator[None]:
        yield

    def run(self, probes: list[NumberedProbe], journal: Journal, load: dict[str, Any],
            console: Console) -> Iterator[ProbeEnd]:
        for probe in probes:
            probe_dir = journal.probe_dir(probe.number, probe.label)
            yield probe, run_job(probe.job, probe.plan, load, probe_dir, seed=probe.seed, console=console), where()


def _probe_task(job: ProbeJob, plan: ProbePlan, load: dict[str, Any], seed: int,
                name: str) -> tuple[ProbeResult | ReproError, dict[str, str], bytes]:
    """In the Ray worker: one probe in a scratch directory; (its result, where it ran, tar.gz of its directory).

    A ReproError (a bad --deploy template, say) comes back as a value: the driver raises it, as the
    local executor would, instead of reading it as a lost task.
    """
    with scratch("repro-probe-") as path:
        probe_dir = path / name
        probe_dir.mkdir()
        try:
            # The driver prints one line per probe; the probe's own lines stay on the node.
            result: ProbeResult | ReproError = run_job(job, plan, load, probe_dir, seed=seed,
                                                       console=Console(quiet=True))
        except ReproError as err:
            result = err
        return result, where(), pack(probe_dir)


class RayProbes:
    """Probes as Ray tasks asking for `resources`, all of one step at once; connected while the search runs."""

    def __init__(self, address: str | None, resources: dict[str, float]) -> None:
        self.address = address
        self.resources = resources
        self._ray: Any = None

    @contextlib.contextmanager
    def connected(self) -> Iterator[None]:
        with connected(self.address) as ray:
            self._ray = ray
            try:
                yield
            finally:
                self._ray = None

    def run(self, probes: list[NumberedProbe], journal: Journal, load: dict[str, Any],
            console: Console) -> Iterator[ProbeEnd]:
        ray = self._ray
        load = absolute_workload(load)
        by_ref = {submit(ray, _probe_task, self.resources, f"repro-probe-{probe.name}",
                         probe.job.portable(), probe.plan, load, probe.seed, probe.name): probe
                  for probe in probes}
        with contextlib.closing(as_completed(ray, dict.fromkeys(by_ref, self.resources), console)) as ended:
            for ref, value, why in ended:
                probe = by_ref[ref]
                if why is not None:
                    result, node = ProbeResult("lost", message=why), None
                else:
                    result, node, archive = value
                    if isinstance(result, ReproError):
                        raise result
                    unpack(archive, journal.probe_dir(probe.number, probe.label))
                console.print(Text(f"  probe {probe.number} on {describe_node(node) or 'no node'}: {describe(result)}"))
                yield probe, result, node


def probe_executor(
    executor: str,
    *,
    ray_address: str | None,
    parallel: int,
    resources: str | None,
    spec_resources: dict[str, float] | None = None,
) -> LocalProbes | RayProbes:
    """The executor the command line asks for, checked before the bisect directory is made.

    `resources` (JSON) wins over `spec_resources` (a matrix spec's, for its cell), which wins over
    one CPU.
    """
    check_executor(executor)
    if parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {parallel}")
    asked = asked_resources(executor, ray_address=ray_address, resources=resources,
                            fallback=(lambda: dict(spec_resources)) if spec_resources else None,
                            local_note=" (the local executor runs every probe here)")
    if asked is not None:
        return RayProbes(ray_address, asked)
    if parallel > 1:
        raise UsageError(f"--parallel {parallel} needs --executor ray: probes at once on one machine would "
                         "share its cores and GPUs, and slow and skew each other")
    return LocalProbes()
