"""Teeth for the hit laws: #49962, #44599 and #55168 reintroduced through test-only seams.

As in ``test_teeth_core.py``: the law fails on the historical row, Hypothesis finds (and
:func:`kvgeom.strategies.minimal` shrinks, deterministically) a counterexample recorded in the
docstring, and the counterexample passes once the correct rule is back. Seams:
``kvgeom.hits.plan_store`` and ``kvgeom.hits.plan_load`` (wrapped), and
``kvgeom.hits._align_to_mamba_chunk``.
"""

from __future__ import annotations

from _hit_laws import check_hit_restores_exact_state, hit_cases
from _laws import H49964
from test_teeth_core import fails

import kvgeom
from kvgeom import hits
from kvgeom.hits import GroupStore, StorePlan
from kvgeom.sim import run_scenario
from kvgeom.strategies import minimal

_DENSE_49964 = {**H49964, "cache": {"retention_interval": None}}
#: A small search space keeps the find-and-shrink of each teeth test to seconds.
TEETH_CASES = {"kinds": ["full_attention", "mamba"], "max_dcp": 8, "max_groups": 2}


def _scenario(n, local=0, evict=(), budget=None):
    sc = {"num_tokens": n, "local_computed_tokens": local, "evict": list(evict)}
    if budget is not None:
        sc["max_num_batched_tokens"] = budget  # the prefill split that decides where Mamba states exist
    return sc


def _store_with_scaled_mamba_span(correct):
    """SimpleCPUOffloadConnector before #49962: every group's span scaled by DCP, so the Mamba group
    stored one state per B_m * D tokens -- block j (the state after (j+1) * B_m tokens) under the
    key of prefix (j+1) * B_m * D, as chunk j took block entries [j*k, (j+1)*k)."""

    def broken(geom, **kwargs):
        plan = correct(geom, **kwargs)
        shards, H = geom.kv_shards, geom.hash_block_size
        groups = []
        for gs in plan.groups:
            og = geom.offload.group(gs.index)
            if geom.groups[gs.index].is_align_mamba and shards > 1:
                C = og.tokens_per_chunk * shards
                k = geom.offload.blocks_per_chunk
                storable = min(plan.offloadable_tokens // C, (kwargs["num_tokens"] // H) // (C // H))
                chunks = tuple(range(storable))
                gs = GroupStore(
                    gs.index, chunks, tuple((j + 1) * C for j in chunks), tuple(((j + 1) * k - 1,) for j in chunks)
                )
            groups.append(gs)
        return StorePlan(plan.offloadable_tokens, tuple(groups))

    return broken


def test_hit_law_catches_49962_store_plan_with_scaled_mamba_span(monkeypatch):
    """vLLM #49962: a confirmed 64-token prefix stored 2 attention + **2** Mamba
    blocks (states after 16 and 32, keyed as prefixes 32 and 64) instead of 2 + 4.

    Caught by ``test_every_hit_restores_mamba_at_exactly_the_hit_boundary_and_matches_a_cold_run``
    (the tier check: the key of prefix 64 holds the state after 32 tokens). Minimal counterexample
    (``TEETH_CASES``): ``({'groups': [{'block_size': 9, 'kind': 'mamba', 'num_speculative_blocks': 0}],
    'parallel': {'dcp': 2, 'tp': 2}, 'cache': {'prefix_caching': True, 'max_model_len': 9},
    'offload': {'block_size': 9}}, {'num_tokens': 18, 'local_computed_tokens': 0, 'evict': []})`` --
    the Mamba key of prefix 18 holds the state after 9 tokens.
    """
    monkeypatch.setattr(hits, "plan_store", _store_with_scaled_mamba_span(hits.plan_store))
    report = run_scenario(kvgeom.resolve(_DENSE_49964), 65)
    assert [list(g.chunks) for g in report.store_plan.groups] == [[0, 1], [0, 1]]  # 2 + 2, the bug's plan
    assert any("holds the state after 32 tokens" in p for p in report.tier_problems)
    assert fails(check_hit_restores_exact_state)((_DENSE_49964, _scenario(65)))
    cex = minimal(hit_cases(**TEETH_CASES), fails(check_hit_restores_exact_state))
    cfg, _sc = cex
    assert "mamba" in [g["kind"] for g in cfg["groups"]] and cfg["parallel"]["dcp"] > 1
    monkeypatch.undo()
    check_hit_restores_exact_state(cex)


def test_hit_law_catches_44599_hit_not_rounded_to_the_mamba_chunk(monkeypatch):
    """vLLM #44599: after ``M = n - 1`` the candidate was not rounded down to the Mamba chunk, so a
    prompt ending exactly on a chunk hit n - 1 tokens and restored the state after n tokens (the last
    prompt token consumed twice; output differs from a cold run).

    Caught by the hit law. Minimal counterexample: ``({'groups': [{'block_size': 2, 'kind': 'mamba',
    'num_speculative_blocks': 0}], 'parallel': {'dcp': 1, 'tp': 1}, 'cache': {'prefix_caching': True,
    'max_model_len': 1, 'retention_interval': None}, 'offload': {'block_size': 2}}, {'num_tokens': 4,
    'local_computed_tokens': 0, 'evict': []})`` -- a prompt of exactly two Mamba chunks hits 3
    tokens and restores the state after 4.
    """
    monkeypatch.setattr(hits, "_align_to_mamba_chunk", lambda m, mamba_chunk: m)
    report = run_scenario(kvgeom.resolve(_DENSE_49964), 64)
    assert report.hit_plan.hit.end_token == 63  # the bug: 63 with the state after 64 tokens
    assert fails(check_hit_restores_exact_state)((_DENSE_49964, _scenario(64)))
    cex = minimal(hit_cases(**TEETH_CASES), fails(check_hit_restores_exact_state))
    cfg, _sc = cex
    assert "mamba" in [g["kind"] for g in cfg["groups"]]
    monkeypatch.undo()
    check_hit_restores_exact_state(cex)


def _load_asserting_attention_grid(correct):
    """SimpleCPU before 0.33's ``cdiv`` load shape: asserted the external hit is a whole number of
    every group's blocks (``num_external_tokens % block_size == 0``)."""

    def broken(geom, hit):
        for og in geom.offload.groups:
            if hit.hit_tokens % og.tokens_per_block:
                raise AssertionError(
                    f"num_external_tokens={hit.hit_tokens} not aligned to group {og.index} "
                    f"block_size={og.tokens_per_block}"
                )
        return correct(geom, hit)

    return broken


_SCALED_55168 = {
    "groups": [{"kind": "full_attention", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
    "parallel": {"tp": 8, "dcp": 8},
    "cache": {"retention_interval": None},
    "offload": {},
}


def test_hit_law_catches_55168_hit_asserted_on_the_attention_grid(monkeypatch):
    """vLLM #55168: SimpleCPU, Kimi-K3 under DCP 8 (KDA span 1536, attention span 12288) got a
    fine-grained hit of 64,512 tokens and died on ``num_external_tokens=64512 not aligned to group 0
    block_size=12288``; a hit may end inside an attention block (loads take cdiv(N, S_g) blocks).

    Caught by the hit law on its scaled-down row (attention 4 x DCP 8 = 32, Mamba 4; Mamba key 96
    evicted -> hit 92, prefilled 4 tokens a step so every Mamba block boundary holds a state). Minimal
    counterexample: ``({'groups': [{'block_size': 3, 'kind':
    'full_attention'}, {'block_size': 2, 'kind': 'full_attention'}], 'parallel': {'dcp': 1, 'tp': 1},
    'cache': {'prefix_caching': True, 'max_model_len': 1}, 'offload': {}}, {'num_tokens': 3,
    'local_computed_tokens': 0, 'evict': []})`` -- not even DCP is needed: with spans 3 and 2 the
    hit of 3 tokens ends inside the second group's block (H = 1, fine-grained hits), which the
    assertion rejects although loading cdiv(3, 2) = 2 blocks is correct.
    """
    monkeypatch.setattr(hits, "plan_load", _load_asserting_attention_grid(hits.plan_load))
    # prefilled 4 tokens a step, so a Mamba state exists at every 4-token block boundary (vLLM's split)
    row = (_SCALED_55168, _scenario(97, evict=[False] * 26 + [True], budget=4))
    assert fails(check_hit_restores_exact_state)(row)
    cex = minimal(hit_cases(**TEETH_CASES), fails(check_hit_restores_exact_state))
    cfg, _sc = cex
    # the hit ends off some group's span grid: spans differ (by block size, or by DCP on attention alone;
    # which of the two the shrinker reaches depends on the examples it saw first)
    assert len({g.span for g in kvgeom.resolve(cfg).groups}) > 1
    monkeypatch.undo()
    check_hit_restores_exact_state(row)
    check_hit_restores_exact_state(cex)
