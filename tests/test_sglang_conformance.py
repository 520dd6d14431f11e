"""kvgeom's SGLang geometry against SGLang 0.5.23 itself (runs in the SGLang venv of
scripts/install-sglang-cpu.sh; skipped elsewhere)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang", reason="needs SGLang 0.5.23 (scripts/install-sglang-cpu.sh)")

from kvgeom.conformance.sglang_engine import (  # noqa: E402
    compare_sheets,
    kvgeom_sglang_answers,
    run_sglang,
    sglang_answers,
)

BASE = {"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"], "mamba_chunk_size": 192,
        "mamba_track_interval": 768, "mamba_radix_cache_strategy": "extra_buffer",
        "_transfer": {"num_kv_tokens": 10, "dcp_rank": 1, "decode_prefix_len": 128, "src_page_offset": 1}}


def _both(case):
    return sglang_answers(case), kvgeom_sglang_answers(case)


def test_the_34808_grid_agrees():
    # tree page 128 (64 x DCP 2), chunk 192: SGLang's own mamba_checkpoint_grid is lcm = 384, track 768
    engine, ours = _both(BASE)
    assert (engine["checkpoint_grid"], engine["track_grid"], engine["kv_event_block_size"]) == (384, 768, 128)
    assert compare_sheets(engine, ours) == []


def test_a_pre_fix_grid_would_be_caught():
    """The harness has teeth: a kvgeom answering the chunk grid (the bug of #34808) differs from SGLang."""
    engine, ours = _both(BASE)
    ours["checkpoint_grid"] = 192
    assert [d["question"] for d in compare_sheets(engine, ours)] == ["checkpoint_grid"]


@pytest.mark.parametrize("change, question, answer", [
    ({"page_size": 128}, "mamba_chunk", "refused"),                       # 128 and 192 do not divide
    ({"mamba_track_interval": 96}, "extra_buffer", "refused"),            # not a page multiple
    ({"speculative_num_draft_tokens": 1000}, "extra_buffer", "refused"),  # below the draft tokens
    ({"chunked_prefill_size": 100}, "extra_buffer", "warned"),            # below the chunk 192
    ({"mamba_radix_cache_strategy": "extra_buffer_lazy", "disaggregation_mode": "decode"}, "extra_buffer",
     "refused"),
    ({"mamba_radix_cache_strategy": "no_buffer"}, "no_buffer", "refused"),  # page 64, overlap on
    ({"enable_hierarchical_cache": True, "hicache_storage_backend": "file"}, "hicache_storage", "refused"),
    ({"_transfer": {"num_kv_tokens": 4, "dcp_rank": 0, "decode_prefix_len": 64, "src_page_offset": 0}},
     "transfer", "refused"),                                              # 64 is off the 128 virtual page
])
def test_validators_agree(change, question, answer):
    engine, ours = _both({**BASE, **change})
    assert engine[question] == answer
    assert compare_sheets(engine, ours) == []


def test_transfer_plan_agrees_row_by_row():
    engine, ours = _both(BASE)
    assert engine["transfer"] == ours["transfer"] and engine["transfer"][2] == list(range(10))


def test_generated_cases_agree():
    report = run_sglang(examples=150, seed=0)
    assert report.cases_checked > 100
    assert report.exit_code == 0, report.render()


# -- hit lengths from SGLang's shipped unified radix cache kit (full + Mamba, page 1) ---------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvgeom.conformance.sglang_radix import kvgeom_hits, radix_hits  # noqa: E402

_seqs = st.lists(st.integers(0, 2), min_size=1, max_size=12)


def test_radix_kit_hits_agree_on_a_split():
    # #22935's shape: a checkpoint only where an insert ends; a query branching inside gets the split point
    # only when an insert ended there
    inserts = [list(range(16)), list(range(8))]
    queries = [list(range(16)), [*range(10), 99, 99], [*range(5)]]
    assert radix_hits(inserts, queries) == kvgeom_hits(inserts, queries) == [(16, 16), (8, 10), (0, 5)]


@settings(max_examples=25, deadline=None)
@given(st.lists(_seqs, min_size=1, max_size=6), st.lists(_seqs, min_size=1, max_size=4))
def test_radix_kit_hits_agree_on_generated_trees(inserts, queries):
    assert radix_hits(inserts, queries) == kvgeom_hits(inserts, queries)
