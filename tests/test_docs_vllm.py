"""The pages for connector and router authors run as written against vLLM 0.33's real objects.

Each page in :data:`PAGES` has its `python` code blocks run in order, in one namespace per page,
in the vLLM venv (``.ci/run``): the objects are vLLM's own (``VllmConfig``, ``KVCacheConfig``,
spec classes, ``Request`` with vLLM's block hasher) on vLLM's defaults, nothing is stood in. A page
that fails here fails for a reader who copies it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from _vllm import NEEDS_VLLM

pytestmark = NEEDS_VLLM

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Pages whose code blocks run here (in order, one namespace per page).
PAGES = ["connector.md", "getting-vllm-objects.md", "routing.md", "hashing.md"]

FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)


def code_blocks(page: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block of ``docs/<page>``, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def run_page(page: str) -> dict[str, Any]:
    """Run every python block of ``page`` in order in one namespace; the namespace afterwards.

    Each block is compiled with the page's name and its line numbers, so a failure's traceback
    points at the line of the page."""
    scope: dict[str, Any] = {"__name__": f"docs.{page}"}
    for line, source in code_blocks(page):
        code = compile("\n" * (line - 1) + source, str(DOCS / page), "exec")
        exec(code, scope)
    return scope


def test_the_runner_finds_blocks_in_order():
    blocks = code_blocks("connector.md")
    assert len(blocks) >= 3
    assert [line for line, _ in blocks] == sorted(line for line, _ in blocks)
    assert "vllm_config = make_vllm_config()" in blocks[0][1]


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_on_vllms_real_objects(page):
    assert code_blocks(page), f"docs/{page} has no python block"
    run_page(page)


def test_the_connector_page_uses_vllms_real_objects_and_defaults():
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    scope = run_page("connector.md")
    assert isinstance(scope["make_vllm_config"](), VllmConfig)
    assert isinstance(scope["kv_cache_config"], KVCacheConfig)
    assert isinstance(scope["a"], Request)
    # the defaults the page states: retention 0 (one Mamba state per stored prompt), sha256 hashes
    default = scope["make_vllm_config"]().cache_config
    assert default.prefix_cache_retention_interval == 0
    assert default.prefix_caching_hash_algo == "sha256"
    assert max(scope["a"].prompt_token_ids) >= 256  # real token ids, not bytes


def test_the_documented_conform_run_is_what_kvgeom_conform_prints():
    # docs/checking-your-engine.md showed a run of an older checker (249 cases, 21 and 7 deviations).
    # Run as a user does, in a fresh process: in this one, earlier tests have loaded a Hypothesis profile
    # and touched vLLM's module state, which changes what an in-process run draws.
    import os
    import subprocess
    import sys

    page = (DOCS / "checking-your-engine.md").read_text(encoding="utf-8")
    shown = page.split("$ kvgeom conform\n", 1)[1].split("```", 1)[0].splitlines()
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    env["PYTHONPATH"] = str(DOCS.parent)
    run = subprocess.run([sys.executable, "-m", "kvgeom", "conform"], capture_output=True, text=True, env=env,
                         cwd=DOCS.parent, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = run.stdout.splitlines()
    assert len(printed) == len(shown), (shown, printed)
    for want, got in zip(shown, printed, strict=True):  # "..." cuts a line: the part before it is printed
        assert (got.startswith(want.split("...", 1)[0]) if "..." in want else got == want), (want, got)
