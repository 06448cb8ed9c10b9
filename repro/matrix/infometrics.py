"""A server's configuration read from its Prometheus info metrics, for servers without `/server_info`.

vLLM has no `/server_info`; it publishes its effective cache configuration as the labels of a gauge,
`vllm:cache_config_info{enable_prefix_caching="True",block_size="16",...} 1`. Each `*_info` sample
becomes an entry keyed by its metric name, holding its labels with `True`/`False` and integers read
as such, so a spec confirms `vllm:cache_config_info.enable_prefix_caching: true`. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_INT = re.compile(r"-?[0-9]+")


def _value(label: str) -> Any:
    if label in ("True", "False", "true", "false"):
        return label in ("True", "true")
    if _INT.fullmatch(label):
        return int(label)
    return label


def info_from_metrics(text: str) -> dict[str, Any] | None:
    """The `*_info` samples of a Prometheus exposition as {metric: {label: value}}; None when it has none."""
    info: dict[str, Any] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_info"):
                    info[sample.name] = {key: _value(value) for key, value in sample.labels.items()}
    except ValueError:
        return None
    return info or None
