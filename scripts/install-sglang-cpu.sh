#!/usr/bin/env bash
# Install SGLang 0.5.23 for CPU into a separate virtual environment, for `kvgeom conform --engine sglang`
# and the `sglang`-marked tests. Usage: scripts/install-sglang-cpu.sh [VENV_DIR]   (default: .ci-sglang-venv)
#
# * Cached: a VENV_DIR whose Python already imports SGLang 0.5.23's geometry modules (with the stubs of
#   scripts/sglang-stubs on PYTHONPATH), Hypothesis and pytest is reused untouched.
# * Pinned: sglang==0.5.23 with --no-deps (its metadata pins a CUDA torch 2.14.1 and GPU stacks); its
#   import-time dependencies from scripts/sglang-cpu-constraints.txt, torch the CPU build 2.13.0. No
#   torchvision (the PyPI build is CUDA-only and breaks transformers next to CPU torch) and no datasets:
#   scripts/sglang-stubs stands in for both (run with PYTHONPATH=scripts/sglang-stubs). vLLM is not needed.
#   Off these machines: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install-sglang-cpu.sh
# * Robust: pip retries and timeouts, and each install step is retried three times.
# Measured on the 2-core CI machine (fresh venv): about 4 to 5 minutes and 2.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.ci-sglang-venv}
CONSTRAINTS=scripts/sglang-cpu-constraints.txt
STUBS="$PWD/scripts/sglang-stubs"
SGLANG_VERSION=0.5.23
PIP_OPTS=(--quiet --retries 5 --timeout 120 --disable-pip-version-check)
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then PIP_OPTS+=(--extra-index-url "$TORCH_INDEX_URL"); fi

retry() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "install-sglang-cpu: attempt $n of: $* failed; retrying in $((n * 10)) s" >&2
        sleep $((n * 10))
    done
    return 1
}

ready() {
    [[ -x "$VENV/bin/python" ]] && PYTHONPATH="$STUBS" "$VENV/bin/python" - "$SGLANG_VERSION" <<'PY' 2>/dev/null
import importlib.metadata, sys
import sglang.srt.runtime_context, sglang.srt.arg_groups.overrides, sglang.srt.arg_groups.mamba_hook  # noqa: E401
import sglang.srt.disaggregation.common.utils, sglang.srt.mem_cache.hicache_storage  # noqa: E401
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: F401
import hypothesis, pytest, pydantic  # noqa: E401, F401
sys.exit(0 if importlib.metadata.version("sglang") == sys.argv[1] else 1)
PY
}

if ready; then
    echo "install-sglang-cpu: reusing $VENV (SGLang $SGLANG_VERSION already installed)"
else
    echo "install-sglang-cpu: installing SGLang $SGLANG_VERSION (CPU) into $VENV"
    python3 -m venv "$VENV"
    PY="$VENV/bin/python"
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --upgrade pip
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" torch==2.13.0
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps "sglang==$SGLANG_VERSION"
    # SGLang's import-time dependencies (found one ImportError at a time), then the test tools, all pinned.
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" \
        orjson ipython dill sentencepiece compressed-tensors gguf pybase64 triton pillow starlette msgspec \
        pyzmq aiohttp apache-tvm-ffi openai partial-json-parser hypothesis pytest pytest-xdist pydantic
    ready || { echo "install-sglang-cpu: SGLang $SGLANG_VERSION does not import in $VENV" >&2; exit 1; }
fi
