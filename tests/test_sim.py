"""Example table for kvgeom.sim: kvgeom's plans pass, deliberately wrong plans are reported.

Geometry of most rows: #49964, full attention 16 + Mamba 16 under DCP 2,
spans (32, 16), dense retention so every Mamba state is stored.
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom import hits
from kvgeom.sim import Simulator, run_scenario

DENSE = {**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}}


def _stored_sim(cfg, n):
    """Prefilled 16 tokens a step, so vLLM's split leaves a Mamba state at every 16-token block boundary."""
    g = kvgeom.resolve(cfg)
    sim = Simulator(g)
    sim.prefill(n)
    ends = kvgeom.prefill_chunk_ends(g, n, max_num_batched_tokens=16)
    sim.store(hits.plan_store(g, num_tokens=n, num_computed_tokens=n, chunk_ends=ends))
    return g, sim


@pytest.mark.parametrize(
    ("cfg", "n", "local", "end"),
    [
        (DENSE, 65, 0, 64),  # Example 1: hit 64 = attention chunks 0-1 + the Mamba state after 64 tokens
        (DENSE, 64, 0, 48),  # #44599: a prompt ending on a chunk restores 48, never 63 or 64
        (DENSE, 80, 40, 64),  # local prefix 40: lookup from rdown(40, L) = 32
        (kvgeom.DEFAULT_CONFIG, 65, 0, 64),  # retention 0: only the replay boundary 64 is stored
        (DENSE, 10, 0, 0),  # shorter than a chunk: no hit
        ({**DENSE, "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 16}}, 65, 0, 64),  # block-level dealing
        # k = 2: attention chunks of 64 tokens, Mamba chunks of 32; 100 tokens hold one attention chunk, and
        # vLLM's unbounded split leaves Mamba 96 alone: no hit (vLLM run: stores attention 64, Mamba 96; hit 0)
        ({**DENSE, "offload": {"blocks_per_chunk": 2}}, 100, 0, 0),
    ],
)
def test_kvgeom_plans_restore_what_a_cold_run_holds(cfg, n, local, end):
    report = run_scenario(kvgeom.resolve(cfg), n, local_computed_tokens=local)
    assert report.hit_plan.hit.end_token == end
    assert report.ok, (report.tier_problems, report.restore_problems)


def test_ranks_hold_only_the_positions_dealt_to_them():
    # docs/keys-and-boundaries.md: B 16, D 2, I 1 -> position 37 on rank 1, offset 2 of column 1.
    _g, sim = _stored_sim(DENSE, 64)
    block = sim.groups[0].row[1]
    assert sim.pages[(1, block)][2] == 37
    assert sorted(sim.pages[(0, block)]) == list(range(32, 64, 2))


def test_evicting_the_mamba_key_falls_back_to_an_earlier_boundary():
    # prefilled 16 tokens a step (a Mamba state at every block boundary, as vLLM stores them): Mamba key 64
    # lost -> the right-most earlier Mamba key is 48
    report = run_scenario(kvgeom.resolve(DENSE), 65, evict=lambda group, end: (group, end) == (1, 64),
                          max_num_batched_tokens=16)
    assert report.hit_plan.hit.end_token == 48
    assert report.ok


def test_wrong_store_plan_is_reported_by_check_tier():
    # A connector that stores Mamba block 1 (state after 32) under the key of prefix 64 (#49962 shape).
    g = kvgeom.resolve(DENSE)
    sim = Simulator(g)
    sim.prefill(64)
    sim.store({"groups": [{"index": 1, "end_tokens": [64], "block_entries": [[1]]}]})
    assert sim.check_tier() == ["group 1: Mamba key ending at 64 holds the state after 32 tokens"]


def test_wrong_attention_entries_are_reported_by_check_tier():
    # Chunk 1's key filled from block entry 0: it holds positions [0, 32), not [32, 64).
    g = kvgeom.resolve(DENSE)
    sim = Simulator(g)
    sim.prefill(64)
    sim.store({"groups": [{"index": 0, "end_tokens": [64], "block_entries": [[0]]}]})
    problems = sim.check_tier()
    assert problems and "dealt to" in problems[0]


def test_wrong_hit_plan_is_reported_by_check_restored():
    # Hit 63 loading the Mamba key of prefix 64 (#44599): the state consumed the last token.
    _g, sim = _stored_sim(DENSE, 64)
    sim.reset()
    plan = {
        "hit_tokens": 63,
        "end_token": 63,
        "groups": [
            {"index": 0, "load_keys": [32, 64], "block_entries": [0, 1], "state_block": None},
            {"index": 1, "load_keys": [64], "block_entries": [3], "state_block": 3},
        ],
    }
    sim.load(plan)
    assert sim.check_restored(plan, num_tokens=64) == [
        "group 1: a request resuming at 63 reads Mamba block 3, which holds the state after 64 tokens "
        "(a cold run holds 63)"
    ]


def test_attention_chunk_loaded_into_the_wrong_entry_is_reported():
    _g, sim = _stored_sim(DENSE, 64)
    sim.reset()
    plan = {
        "hit_tokens": 32,
        "end_token": 32,
        "groups": [
            {"index": 0, "load_keys": [64], "block_entries": [1], "state_block": None},
            {"index": 1, "load_keys": [32], "block_entries": [1], "state_block": 1},
        ],
    }
    sim.load(plan)
    problems = sim.check_restored(plan, num_tokens=64)
    assert any("position 0 is missing" in p for p in problems)


def test_loading_a_key_the_tier_does_not_hold_raises():
    _g, sim = _stored_sim(DENSE, 40)
    sim.reset()
    plan = {"hit_tokens": 64, "end_token": 64, "groups": [{"index": 0, "load_keys": [64], "block_entries": [0, 1]}]}
    with pytest.raises(kvgeom.QueryError) as e:
        sim.load(plan)
    assert e.value.code == "sim_missing_key"


@pytest.mark.parametrize(
    ("cfg", "code"),
    [
        # no offloading connector: no keys, no tier
        ({"groups": [{"kind": "full_attention", "block_size": 16}]}, "no_offload"),
        # a Mamba group in none mode is not modelled (its state is not kept per boundary)
        (
            {
                "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                "cache": {"prefix_caching": False},
                "offload": {},
            },
            "sim_unsupported_group",
        ),
    ],
)
def test_unsupported_geometries_raise_query_errors(cfg, code):
    g = kvgeom.resolve(cfg)
    with pytest.raises(kvgeom.QueryError) as e:
        Simulator(g)
    assert e.value.code == code


# ------------------------------------------------- the GPU prefix cache under the EAGLE drop (issue 19)
# Rows run through vLLM 0.33's real Scheduler: a cold prompt of n1 tokens finishes, the block pool's cached
# entries are read per group, then a request of n2 tokens sharing it asks the GPU prefix cache
# (Scheduler._get_local_prefix_cache_hit). "sw" is a sliding-window group of block 16 and window 32.
_SW = {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}
_FA = {"kind": "full_attention", "block_size": 16}
_NO_LOOKAHEAD = {"method": "eagle", "num_speculative_tokens": 1, "lookahead_hashes": False}
GPU_ROWS = [
    # R = 0: the run at the replay boundary rdown(199, 16) - 16 = 176 is one block longer and one later
    ("r0", [_FA, {**_SW, "drafter": True}], _NO_LOOKAHEAD, 0, {}, 200, 220, [160, 176, 192], 176),
    # R = 64: 3-block runs past each 64-token boundary, plus the replay run
    ("r64", [_FA, {**_SW, "drafter": True}], _NO_LOOKAHEAD, 64, {}, 200, 220,
     [48, 64, 80, 112, 128, 144, 160, 176, 192], 176),
    ("r0-100", [_FA, {**_SW, "drafter": True}], _NO_LOOKAHEAD, 0, {}, 100, 120, [64, 80, 96], 80),
    # no group marked: every group drops (the coordinator's fallback), the mask shifts the same way
    ("unmarked", [_FA, _SW], _NO_LOOKAHEAD, 0, {}, 100, 120, [64, 80, 96], 80),
    # look-ahead hashes: no drop, the plain mask at n - 1 = 99 -> 96 (vLLM hits 96)
    ("lookahead", [_FA, {**_SW, "drafter": True}], {"method": "eagle", "num_speculative_tokens": 1}, 0, {},
     100, 120, [80, 96], 96),
]


# Every row also with an offload section (k = 1 and 2), except look-ahead hashes, which a connector turns off:
# without look-ahead hashes the connector changes no input of the GPU managers, so the GPU mask is the GPU
# side's (its EAGLE shift, aligned to the hit alignment, not to the connector's chunk). Run on vLLM 0.33
# (vllm_stores.run_store_then_lookup's gpu_cached with these offload sections: the rows' window entries).
_GPU_CASES = [pytest.param(*row, offload, id=f"{row[0]}-{label}") for row in GPU_ROWS
              for label, offload in (("no-offload", None), ("offload", {}), ("offload-k2", {"blocks_per_chunk": 2}))
              if offload is None or row[0] != "lookahead"]


@pytest.mark.parametrize(("name", "groups", "spec", "retention", "cache", "n1", "n2", "window_entries", "hit",
                          "offload"), _GPU_CASES)
def test_gpu_prefix_cache_under_the_eagle_drop_matches_vllm(name, groups, spec, retention, cache, n1, n2,
                                                            window_entries, hit, offload):
    from kvgeom.sim import GPUPrefixCache

    cfg = {"groups": groups, "speculative": spec, "cache": {"retention_interval": retention, **cache}}
    g = kvgeom.resolve(cfg if offload is None else {**cfg, "offload": offload})
    c = GPUPrefixCache(g)
    c.cache_request(n1)
    resident = c.resident()
    assert resident["0"] == list(range(16, n1 // 16 * 16 + 1, 16))
    assert resident["1"] == window_entries
    assert kvgeom.prefix_hit(g, n2, resident).hit_tokens == hit


def test_an_eagle_full_attention_group_keys_its_partial_tail_up_to_the_prompt():
    # FA32 + SWA32 (window 2), both drafters, EAGLE K3, H = 16, R = 64, prompt 96 (vLLM run): the EAGLE
    # manager's partial tail would be rdown(96, 16) = 96, a full block, so no partial entry at 80 (without
    # the drop the cap is n - 1: 80). The GPU hit of a 164-token request is 64.
    from kvgeom.sim import GPUPrefixCache

    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                   {"kind": "sliding_window", "block_size": 32, "sliding_window": 2,
                                    "drafter": True}],
                        "speculative": {"method": "eagle", "num_speculative_tokens": 3, "lookahead_hashes": False},
                        "cache": {"retention_interval": 64, "prefix_match_unit": 16}, "offload": {}})
    c = GPUPrefixCache(g)
    c.cache_request(96)
    assert c.resident() == {"0": [32, 64, 96], "1": [32, 64, 96]}
    assert kvgeom.prefix_hit(g, 164, c.resident()).hit_tokens == 64
