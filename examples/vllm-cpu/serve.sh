#!/usr/bin/env bash
# Serve the tiny DeepSeek-style model with vLLM's CPU build on 127.0.0.1:PORT, in the foreground.
#   examples/vllm-cpu/serve.sh PORT [more vLLM flags, e.g. --enable-prefix-caching --max-num-seqs 8]
# The engine must be installed first (install_engine.sh); the model is built on first use.
# Ready when GET /v1/models answers (1.5-3.5 minutes on 2 cores, about 4 GB of RAM).
# Stop it by its process group: SIGTERM, then SIGKILL (SIGTERM during start-up can hang).
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: serve.sh PORT [vLLM flags...]" >&2
    exit 2
fi
PORT="$1"
shift
VERSION="${REPRO_VLLM_VERSION:-0.32.0}"
ROOT="${REPRO_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/repro-engine}"
PY="$ROOT/vllm-cpu-$VERSION/bin/python"
MODEL="${REPRO_ENGINE_MODEL:-$ROOT/models/tiny-dsv4}"
HERE="$(cd "$(dirname "$0")" && pwd)"

if [ ! -f "$ROOT/vllm-cpu-$VERSION/.repro-complete" ]; then
    echo "serve: vllm-cpu $VERSION is not installed under $ROOT; run examples/vllm-cpu/install_engine.sh" >&2
    exit 3
fi
"$PY" "$HERE/build_model.py" "$MODEL"

# Loopback only (otherwise vLLM binds the machine's interface for its message queue); caches in the
# engine's own directory (torch.compile's cache makes a warm start about a minute faster); no hub.
export VLLM_HOST_IP=127.0.0.1 VLLM_LOOPBACK_IP=127.0.0.1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/vllm-cache}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# The `vllm` console script fails under the vllm-cpu distribution name: the module it is.
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name tiny-dsv4 \
    --dtype float32 --max-model-len 32768 --tokenizer-mode deepseek_v4 --enable-auto-tool-choice \
    --tool-call-parser deepseek_v4 --reasoning-parser deepseek_v4 --host 127.0.0.1 --port "$PORT" "$@"
