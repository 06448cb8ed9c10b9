"""The features a `feature-off` control arm can switch off on the embedded simulator: the flag that does
it and the `/server_info` key that confirms it took effect.

Only a server repro launches can be restarted with a flag; against a URL the way to compare a feature on
and off is `repro matrix` (a factor whose levels carry the flags, each level confirmed by `/server_info`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class FeatureOff:
    """How one feature is switched off and how `/server_info` shows it off."""

    label: str
    flags: tuple[str, ...]
    key: str
    off: Any


FEATURES_OFF: dict[str, FeatureOff] = {
    "hicache": FeatureOff("HiCache", ("--no-enable-hierarchical-cache",), "enable_hierarchical_cache", False),
    "cuda-graph": FeatureOff("CUDA graph", ("--disable-cuda-graph",), "disable_cuda_graph", True),
    "overlap-schedule": FeatureOff("the overlap schedule", ("--disable-overlap-schedule",), "disable_overlap_schedule",
                                   True),
    "pd": FeatureOff("PD disaggregation", ("--disaggregation-mode", "null"), "disaggregation_mode", "null"),
}
"""By the name `--control feature-off=NAME` takes. The flags go after the run's own `--sim-args`: the last wins."""


def confirmed_off(feature: FeatureOff, server_info: Mapping[str, Any] | None) -> bool | None:
    """Does the control arm's `/server_info` show the feature off? None when the server reported none."""
    if server_info is None or feature.key not in server_info:
        return None
    return bool(server_info[feature.key] == feature.off)
