#!/usr/bin/env bash
# Install LMCache 0.5.6 into the vLLM 0.33 CPU venv, for `kvgeom conform --engine lmcache` and the
# `lmcache`-marked tests. Usage: scripts/install-lmcache-cpu.sh [VENV_DIR]   (default: .ci-vllm-venv)
# Run scripts/install-vllm-cpu.sh VENV_DIR first: LMCache runs next to vLLM, in the same venv.
#
# * Cached: a VENV_DIR whose Python already imports LMCache 0.5.6's geometry modules is reused untouched.
# * Pinned: lmcache==0.5.6 with --no-deps (its declared dependencies pull GPU stacks and numpy<=2.2.6), then
#   the three modules its geometry code imports: numba 0.68.1 (works with the venv's numpy) and llvmlite 0.50.0,
#   msgspec and sortedcontainers as pinned in scripts/vllm-cpu-constraints.txt; and two more of LMCache's declared
#   dependencies its transfer-side code imports (object_group_transfer, the MP TokenHasher), cryptography 50.0.2
#   and blake3 1.0.11, for the conformance harness's staging and hash-chain checks. About 35 s and 110 MB here.
# * Robust: pip retries and timeouts, and each install step is retried three times.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.ci-vllm-venv}
LMCACHE_VERSION=0.5.6
CONSTRAINTS=scripts/vllm-cpu-constraints.txt
PIP_OPTS=(--quiet --retries 5 --timeout 120 --disable-pip-version-check)

retry() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "install-lmcache-cpu: attempt $n of: $* failed; retrying in $((n * 10)) s" >&2
        sleep $((n * 10))
    done
    return 1
}

ready() {
    VLLM_LOGGING_LEVEL=ERROR "$VENV/bin/python" - "$LMCACHE_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata, sys
import msgspec, numba, sortedcontainers  # noqa: E401, F401  (what LMCache's geometry modules import)
from lmcache.integration.vllm.kv_cache_groups import get_tokens_per_block  # noqa: F401
from lmcache.v1.multiprocess.group_view import slice_block_ids_per_group  # noqa: F401
from lmcache.v1.multiprocess.object_group_transfer import downsample_and_stage_block_ids  # noqa: F401
import blake3  # noqa: F401  (the MP server's TokenHasher default)
sys.exit(0 if importlib.metadata.version("lmcache") == sys.argv[1] else 1)
PY
}

[[ -x "$VENV/bin/python" ]] || { echo "install-lmcache-cpu: no venv at $VENV (run scripts/install-vllm-cpu.sh first)" >&2; exit 1; }
if ready; then
    echo "install-lmcache-cpu: reusing $VENV (LMCache $LMCACHE_VERSION already installed)"
else
    echo "install-lmcache-cpu: installing LMCache $LMCACHE_VERSION into $VENV"
    PY="$VENV/bin/python"
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps "lmcache==$LMCACHE_VERSION"
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" msgspec sortedcontainers numba==0.68.1 llvmlite==0.50.0
    retry "$PY" -m pip install "${PIP_OPTS[@]}" -c "$CONSTRAINTS" cryptography==50.0.2 blake3==1.0.11
    ready || { echo "install-lmcache-cpu: LMCache $LMCACHE_VERSION does not import in $VENV" >&2; exit 1; }
fi
