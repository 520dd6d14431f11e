"""The Python code blocks of the router's pages run as written, in order, one namespace per page.

docs/routing.md goes from token ids to replica scores and docs/hashing.md computes vLLM's block hashes;
each ```python block of those pages is executed here (and the vLLM-marked tests/test_hashing_vllm.py checks
the routing page's hashes against vLLM 0.33's own request hasher). A block that is not meant to run must
use another fence (```text). The pages' asserts are their expected output.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ["routing.md", "hashing.md", "resolution.md"]


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of ``docs/<page>``, in page order."""
    return re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(encoding="utf-8"), flags=re.S | re.M)


def run_page(page: str) -> dict:
    """Execute every Python block of ``page`` in one namespace and return it."""
    namespace: dict = {"__name__": f"docs_{page.replace('.', '_')}"}
    for i, block in enumerate(python_blocks(page)):
        exec(compile(block, f"docs/{page} (python block {i + 1})", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page, capsys):
    assert python_blocks(page), f"docs/{page} has no ```python block"
    run_page(page)
    capsys.readouterr()


def test_routing_page_routes_to_pod_a():
    ns = run_page("routing.md")
    assert len(ns["chain"]) == 8 and ns["best"] == "pod-a"
