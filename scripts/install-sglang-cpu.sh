#!/usr/bin/env bash
# Install SGLang 0.5.23 for CPU into a separate virtual environment, for `kvgeom conform --engine sglang`
# and the `sglang`-marked tests. Usage: scripts/install-sglang-cpu.sh [VENV_DIR]   (default: .ci-sglang-venv)
#
# * Cached: a VENV_DIR whose Python already imports SGLang 0.5.23's geometry modules (with the stubs of
#   scripts/sglang-stubs on PYTHONPATH), Hypothesis and pytest is reused untouched.
# * Pinned and lean: one pip call with --no-deps (no resolver): sglang==0.5.23 (its metadata pins a CUDA
#   torch 2.14.1 and GPU stacks), the CPU torch 2.13.0 and its own dependencies, and exactly the packages
#   SGLang's geometry modules, its radix-cache test kit and its KV-event code import, plus the test tools,
#   each pinned by scripts/sglang-cpu-constraints.txt (the list was found one ImportError at a time in a
#   fresh venv). No triton (about 1 GB): scripts/sglang-stubs/fallback/triton stands in, on sys.path
#   after site-packages. No torchvision (the PyPI build is CUDA-only and breaks transformers next to CPU
#   torch) and no datasets: scripts/sglang-stubs stands in for both (run with PYTHONPATH=scripts/sglang-stubs).
#   vLLM is not needed. Off these machines: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install-sglang-cpu.sh
# * Robust: pip retries and timeouts, and the install step is retried three times.
# * --no-compile: pip does not byte-compile the ~1 GB it unpacks; Python compiles what is imported, once.
# Measured on a 2-core machine shared with other jobs (fresh venv, empty PIP_CACHE_DIR): 690 s wall at a
# load of 12-17, 62 s of CPU, 1.2 GB (the resolver-driven install with triton and byte-compilation it
# replaces: 793 s wall at a load of 8-13, 2.5 GB). A reused venv costs the import check: ~11 s of CPU.
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
import sglang.test.kits.unified_radix_cache.fixtures, sglang.test.kits.unified_radix_cache.mixins  # noqa: E401
import sglang.srt.disaggregation.kv_events  # noqa: F401
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
    # torch's own dependencies, then what SGLang imports (found one ImportError at a time), then the test tools.
    retry "$PY" -m pip install "${PIP_OPTS[@]}" --no-deps --no-compile -c "$CONSTRAINTS" "sglang==$SGLANG_VERSION" torch==2.13.0 \
        filelock typing_extensions sympy mpmath networkx Jinja2 MarkupSafe fsspec \
        numpy orjson psutil pybase64 requests urllib3 idna certifi packaging pillow starlette anyio sniffio msgspec \
        pydantic pydantic_core annotated-types typing-inspection pyzmq tqdm ipython traitlets pygments aiohttp \
        multidict yarl propcache attrs aiohappyeyeballs aiosignal frozenlist transformers regex huggingface_hub \
        httpx2 httpcore2 h11 truststore PyYAML safetensors tokenizers sentencepiece dill apache-tvm-ffi \
        compressed-tensors loguru gguf openai partial-json-parser \
        hypothesis sortedcontainers pytest pluggy iniconfig
    SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$STUBS/fallback" > "$SITE/kvgeom-sglang-fallback-stubs.pth"
    ready || { echo "install-sglang-cpu: SGLang $SGLANG_VERSION does not import in $VENV" >&2; exit 1; }
fi
