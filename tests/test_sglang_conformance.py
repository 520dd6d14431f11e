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


# -- hit lengths from SGLang's shipped unified radix cache kit --------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvgeom.conformance.sglang_radix import (  # noqa: E402
    RadixCase,
    Stack,
    check_case,
    kvgeom_hits,
    radix_cases,
    radix_hits,
    radix_run,
)

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


SWA4 = Stack(("full", "swa"), 1, 4)


def test_radix_kit_swa_hit_counts_the_window_from_the_last_tombstone():
    # a 12-token request whose first 6 tokens had left the 4-token window: [0, 6) is a tombstone
    inserts, evicted = [list(range(12))], [6]
    queries = [list(range(12)), list(range(10)), list(range(9)), list(range(6))]
    expected = [(12, 12), (10, 10), (0, 9), (0, 6)]  # 6 and 4 tokens since the tombstone hit; 3 and 0 do not
    assert radix_hits(inserts, queries, SWA4, evicted) == kvgeom_hits(inserts, queries, SWA4, evicted) == expected


def test_radix_kit_swa_insert_recovers_the_live_window():
    # a second request sharing 10 tokens with a live window from 2 revives [2, 6): the hit at 9 comes back
    inserts, evicted = [list(range(12)), [*range(10), 7, 7]], [6, 2]
    queries = [list(range(9)), list(range(5))]
    assert radix_hits(inserts, queries, SWA4, evicted) == kvgeom_hits(inserts, queries, SWA4, evicted) == [
        (9, 9), (0, 5)]


def test_radix_kit_swa_on_pages_and_with_a_draft_window():
    # page 4, window 4: evicted [0, 8) of 16; a 14-token query is page-aligned to 12 = 4 past the tombstone
    stack = Stack(("full", "swa"), 4, 4)
    inserts, evicted, queries = [list(range(16))], [8], [list(range(14)), list(range(8))]
    assert radix_hits(inserts, queries, stack, evicted) == kvgeom_hits(inserts, queries, stack, evicted) == [
        (12, 12), (0, 8)]
    # a fused draft reading 6 back widens the kept history to 6: 4 past the tombstone no longer hits
    drafted = Stack(("full", "swa"), 1, 4, 6)
    inserts, evicted, queries = [list(range(12))], [6], [list(range(10)), list(range(12))]
    assert radix_hits(inserts, queries, drafted, evicted) == kvgeom_hits(inserts, queries, drafted, evicted) == [
        (0, 10), (12, 12)]


def test_radix_kit_mamba_on_pages_checkpoints_at_page_aligned_insert_ends():
    # extra buffer at page 4: a 10-token insert keeps 8 tokens and its state at 8; a query past 12 stops at 12
    stack = Stack(("full", "mamba"), 4)
    inserts = [list(range(10)), list(range(12)), list(range(40))]
    queries = [list(range(14)), list(range(10)), list(range(3)), [*range(30), 9, 9]]
    assert radix_hits(inserts, queries, stack) == kvgeom_hits(inserts, queries, stack) == [
        (12, 12), (8, 8), (0, 0), (12, 28)]


def test_radix_kit_swa_eviction_walk_residency():
    # SGLang's own eviction walk, asked for 4 SWA tokens, tombstones the inner node [0, 4) of a chain
    # 4 -> 8 -> 12; kvgeom's hit rule on the residency it leaves agrees: 4 tokens hit nothing, 8 and 12 hit
    chain = ((*range(4),), (*range(8),), (*range(12),))
    case = RadixCase(SWA4, chain, (0, 0, 0), chain, swa_evict_tokens=4)
    hits, paths = radix_run(case.inserts, case.queries, case.stack, case.evicted, case.swa_evict_tokens)
    assert [p.tombstones for p in paths] == [((0, 4),)] * 3
    assert check_case(case) == (hits, hits) and hits == [(0, 4), (8, 8), (12, 12)]


@settings(max_examples=40, deadline=None)
@given(radix_cases())
def test_radix_kit_hits_agree_on_generated_stacks(case):
    engine, ours = check_case(case)
    assert engine == ours


# -- a router scores SGLang replicas from SGLang's own KV events ---------------------------------------------
def test_router_scores_replicas_from_sglangs_own_events():
    """Events made by SGLang 0.5.23's radix cache (its event code, its publisher's wire encoding), read by
    the same KVEventReader and score_replicas a vLLM fleet uses: each replica's score is the prefix
    SGLang's scheduler reuses there."""
    import msgspec

    from kvgeom.conformance.sglang_radix import event_replica
    from kvgeom.engines.sglang import event_geometry, event_reader, resolve_sglang
    from kvgeom.router import score_replicas

    page = 4
    g = resolve_sglang({"page_size": page})
    a, b = list(range(16)), [*range(8), 50, 51, 52, 53]  # replica 0 holds 4 pages, replica 1 another 3
    queries = [[*range(13), 99, 99, 99], [*range(8), 50, 51, 52, 53, 60, 61], list(range(17)), [7, 7, 7, 7, 7]]
    replicas = [event_replica([a], queries, page), event_replica([b], queries, page)]
    reader = event_reader(g)
    for r, (payloads, _hits, _chains) in enumerate(replicas):
        for p in payloads:
            batch = msgspec.msgpack.decode(p)  # what a subscriber without SGLang sees: [ts, [{"type": ...}], rank]
            stored = [e for e in batch[1] if e["type"] == "BlockStored"]  # a fresh cache also sends AllBlocksCleared
            assert stored and all(e["block_size"] == page for e in stored)
            reader.apply_batch(batch, replica=r)
    chains = replicas[0][2]
    assert chains == replicas[1][2]  # a query's chain does not depend on the replica
    request_chains = [c[: len(q) // page] for c, q in zip(chains, queries, strict=True)]
    scores = score_replicas(event_geometry(g), reader, request_chains, [len(q) for q in queries], num_replicas=2)
    engine = [[replicas[0][1][i], replicas[1][1][i]] for i in range(len(queries))]
    assert scores.tier("GPU").tolist() == engine == [[12, 8], [8, 12], [16, 8], [0, 0]]
