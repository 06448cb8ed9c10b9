"""A configuration confirmed through Prometheus info metrics (vLLM's `vllm:cache_config_info`), over real HTTP."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from repro.matrix.deploy import fetch_server_info, mismatches
from repro.matrix.infometrics import info_from_metrics

# As vLLM 0.32.0 (CPU) serves it, shortened.
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-dsv4"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="False",engine="0",gpu_memory_utilization="0.92",num_cpu_blocks="None",num_gpu_blocks="8192"} 1.0
"""


def test_info_metrics_labels_are_the_configuration() -> None:
    info = info_from_metrics(VLLM_METRICS)
    assert info is not None
    cache = info["vllm:cache_config_info"]
    assert (cache["enable_prefix_caching"], cache["block_size"], cache["cache_dtype"], cache["num_cpu_blocks"]) == (
        False, 128, "auto", "None")
    assert "vllm:num_requests_running" not in info
    assert mismatches({"vllm:cache_config_info.enable_prefix_caching": False}, info) == []
    assert mismatches({"vllm:cache_config_info.enable_prefix_caching": True}, info) == [
        "vllm:cache_config_info.enable_prefix_caching is False, the spec asked for True"]


@pytest.mark.parametrize("text", ["", "no metrics here {", 'vllm:x{a="1"} 1\n'])
def test_an_exposition_without_info_metrics_confirms_nothing(text: str) -> None:
    assert info_from_metrics(text) is None


@pytest.fixture
def metrics_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = VLLM_METRICS.encode() if self.path == "/metrics" else b"{}"
            self.send_response(200 if self.path in ("/metrics", "/server_info") else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_metrics_info_url_is_read_as_the_servers_configuration(metrics_server: str) -> None:
    info = fetch_server_info(f"{metrics_server}/metrics")
    assert info is not None and info["vllm:cache_config_info"]["enable_prefix_caching"] is False
    assert fetch_server_info(f"{metrics_server}/server_info") == {}
