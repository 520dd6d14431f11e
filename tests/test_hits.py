"""Hit lookup and load plans, the eagle pop included (docs/hits.md; vLLM 0.33 offloading/scheduler.py; #44599,
#49962). Store plans (``plan_store``) have their example rows in ``test_store_plans.py``.

The rows marked "(vLLM run)" restate results of running vLLM 0.33 itself on the same deployment.
"""

from __future__ import annotations

import numpy as np
import pytest
from _drafter_rows import DRAFT16, FA16, M16, roundtrip, spec

import kvgeom
from kvgeom import boundaries, hits
from kvgeom.errors import QueryError
from kvgeom.hits import lookup_hit, plan_hit

FA = {"kind": "full_attention"}
SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention span 32, Mamba span 16, k = 1
ALL_64 = {"0": [32, 64], "1": [16, 32, 48, 64]}


def g(groups, parallel=None, cache=None, offload=None):
    cfg = {"groups": groups, "offload": {} if offload is None else offload}
    if parallel:
        cfg["parallel"] = parallel
    if cache:
        cfg["cache"] = cache
    return kvgeom.resolve(cfg)


# (geometry, scenario, hit_tokens, end_token)
HIT_TABLE = [
    # #44599: a 64-token prompt whose every key is stored: -1, then round down to the Mamba chunk -> 48
    (SEED, {"num_tokens": 64, "stored": ALL_64}, 48, 48),
    # #49962 (0.33 shape): a 65-token request with the 64-token prefix stored -> 64
    (SEED, {"num_tokens": 65, "stored": ALL_64}, 64, 64),
    # the Mamba key at the boundary is missing: fall back to an earlier Mamba key
    (SEED, {"num_tokens": 65, "stored": {"0": [32, 64], "1": [16, 32]}}, 32, 32),
    # LMCache #2863: attention stored but no Mamba state -> no hit at all (never report attention alone)
    (SEED, {"num_tokens": 65, "stored": {"0": [32, 64]}}, 0, 0),
    # attention chunk 1 missing: the full-attention prefix stops at 32
    (SEED, {"num_tokens": 65, "stored": {"0": [32], "1": [16, 32, 48, 64]}}, 32, 32),
    # local prefix 32 (a multiple of L): the tier supplies [32, 64)
    (SEED, {"num_tokens": 65, "local_computed_tokens": 32, "stored": ALL_64}, 32, 64),
    # a local prefix of 40 is handed to the connector rounded down to L = 32
    (SEED, {"num_tokens": 65, "local_computed_tokens": 40, "stored": ALL_64}, 32, 64),
    # max_load_tokens 40: candidate 32+... clamps to 40 then to the chunk grids -> 32
    (SEED, {"num_tokens": 65, "stored": ALL_64, "max_load_tokens": 40}, 32, 32),
    # max_num_new_tokens 50 -> 50 - 1 = 49 -> 48
    (SEED, {"num_tokens": 65, "stored": ALL_64, "max_num_new_tokens": 50}, 48, 48),
    # less than one Mamba chunk beyond the local prefix -> 0
    (SEED, {"num_tokens": 40, "local_computed_tokens": 32, "stored": ALL_64}, 0, 32),
    # nothing stored
    (SEED, {"num_tokens": 65}, 0, 0),
    # a resend: 80 tokens of which 64 are prompt; hits may go past the prompt up to num_tokens - 1
    (SEED, {"num_tokens": 80, "num_prompt_tokens": 64, "stored": ALL_64}, 64, 64),
]


@pytest.mark.parametrize(("geom", "scenario", "hit", "end"), HIT_TABLE)
def test_hit_lengths(geom, scenario, hit, end):
    result = geom.plan_hit(scenario)
    assert (result["hit_tokens"], result["end_token"]) == (hit, end)
    for grp in geom.groups:
        if grp.is_align_mamba and hit:
            # the restored state is the state after exactly the hit's end token, never num_tokens
            assert boundaries.is_restorable(geom, grp.index, end)
            assert end < scenario["num_tokens"]


def test_load_plan_example_3():
    # #49962: 2 attention chunks into entries 0, 1; Mamba only the key ending at 64 -> entry 3
    plan = SEED.plan_hit({"num_tokens": 65, "stored": ALL_64})
    assert plan["groups"] == [
        {"index": 0, "load_keys": [32, 64], "block_entries": [0, 1], "state_block": None},
        {"index": 1, "load_keys": [64], "block_entries": [3], "state_block": 3},
    ]


def test_kimi_k3_hit_off_the_attention_grid_55168():
    # #55168: KDA span 1536, attention span 12288 (D = 8). A Mamba-limited hit of 64,512 tokens is not a
    # multiple of 12288; SimpleCPU asserted num_external_tokens % 12288 == 0 and crashed. kvgeom loads
    # cdiv(64512, 12288) = 6 attention blocks and the one KDA state after exactly 64,512 tokens.
    geom = g([{"kind": "mla", "block_size": 1536}, {"kind": "mamba", "block_size": 1536}], {"tp": 8, "dcp": 8})
    stored = {"0": [12288 * (j + 1) for j in range(6)], "1": [1536 * (j + 1) for j in range(42)]}
    plan = geom.plan_hit({"num_tokens": 80000, "stored": stored})
    assert plan["hit_tokens"] == 64512 and 64512 % 12288 != 0
    assert plan["groups"][0]["block_entries"] == [0, 1, 2, 3, 4, 5]
    assert plan["groups"][1]["state_block"] == 64512 // 1536 - 1 == 41
    assert plan["hit_tokens"] % geom.hash_block_size == 0


def test_realign_after_every_clamp_non_divisor_chunks():
    # weicj/vLLM-2080Ti-Definitive #133 shape: attention chunk 48, Mamba chunk 32 (48 is not a multiple of
    # 32). The attention prefix stops at 3 chunks = 144; without re-aligning, the hit would be 144 (derived),
    # whose restore reads block (144-1)//32 = 4, the state after 160 tokens. kvgeom re-aligns to 128.
    geom = g([{"kind": "full_attention", "block_size": 48}, {"kind": "mamba", "block_size": 32}])
    stored = {"0": [48, 96, 144], "1": [32 * j for j in range(1, 7)]}
    plan = geom.plan_hit({"num_tokens": 200, "stored": stored})
    assert plan["hit_tokens"] == 128
    assert plan["groups"][1]["state_block"] == 3
    assert boundaries.restore_read_block(geom, 1, 144) == 4  # what an unaligned 144 would have read
    # when re-aligning leaves less than one attention chunk past the local prefix, the hit is 0, not 48
    plan = geom.plan_hit({"num_tokens": 100, "stored": {"0": [48], "1": [32, 64, 96]}})
    assert plan["hit_tokens"] == 0


SWA = g(
    [{"kind": "full_attention", "block_size": 16}, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
    cache={"retention_interval": None},
)


def test_sliding_window_needs_its_window_ending_at_the_hit():
    # window 40 -> 39 earlier tokens -> 3 chunks of 16. Chunk 3 (48-64) missing: the run ending at 96 is
    # too short (2), the run ending at 48 has 3 chunks -> hit 48.
    stored = {"0": [16 * j for j in range(1, 7)], "1": [16, 32, 48, 80, 96]}
    assert lookup_hit(SWA, 100, stored=stored).end_token == 48
    # the load plan skips N - 39 = 9 tokens -> starts at entry 0
    plan = SWA.plan_hit({"num_tokens": 100, "stored": stored})
    assert plan["groups"][1]["block_entries"] == [0, 1, 2]


def test_sliding_window_run_reaching_scan_start_counts():
    # local prefix 32: a single stored SWA chunk right after it is enough (the rest is on the GPU)
    stored = {"0": [16 * j for j in range(1, 7)], "1": [48]}
    hit = lookup_hit(SWA, 100, stored=stored, local_computed_tokens=32)
    assert (hit.hit_tokens, hit.end_token) == (16, 48)


def test_partial_tail_d1():
    # D = 1, k = 1, spans 16, H = 8 < B_m: after the complete hit (32) probe boundary 40
    geom = g([{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
             cache={"prefix_match_unit": 8})
    assert geom.offload.supports_partial_tail
    stored = {"0": [16, 32, 40], "1": [16, 32, 40]}
    hit = lookup_hit(geom, 50, stored=stored)
    assert (hit.end_token, hit.partial_tail) == (40, True)
    plan = plan_hit(geom, {"num_tokens": 50, "stored": stored}).to_dict()
    assert plan["groups"][0]["load_keys"] == [16, 32, 40]
    assert plan["groups"][1] == {"index": 1, "load_keys": [40], "block_entries": [2], "state_block": 2}
    # one group missing the boundary key -> no tail
    assert lookup_hit(geom, 50, stored={"0": [16, 32, 40], "1": [16, 32]}).end_token == 32


def test_dcp_disables_partial_tails():
    geom = g([{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}], {"tp": 2, "dcp": 2},
             {"prefix_match_unit": 8})
    assert not geom.offload.supports_partial_tail
    hit = lookup_hit(geom, 50, stored={"0": [32], "1": [16, 32, 40]})
    assert (hit.end_token, hit.partial_tail) == (32, False)










SCENARIO_ERRORS = [
    ({"num_tokens": -1}, "negative"),
    ({"num_tokens": 10, "bogus": 1}, "unknown_key"),
    ({}, "missing_field"),
    ({"num_tokens": 64, "stored": {"7": [16]}}, "group_not_offloaded"),
    ({"num_tokens": 64, "stored": {"1": [20]}}, "not_on_hash_grid"),
    ({"num_tokens": 64, "stored": {"1": "16"}}, "bad_stored"),
    ({"num_tokens": 64, "num_prompt_tokens": 65}, "prompt_longer_than_request"),
    ({"num_tokens": 64, "local_computed_tokens": 65}, "local_past_request"),
    ({"num_tokens": 2**63}, "int64_overflow"),
    ({"num_tokens": "64"}, "not_an_integer"),
]


@pytest.mark.parametrize(("scenario", "code"), SCENARIO_ERRORS)
def test_bad_scenarios(scenario, code):
    with pytest.raises(QueryError) as info:
        SEED.plan_hit(scenario)
    assert info.value.code == code


def test_long_request_with_few_keys_scans_fast():
    # the window scan jumps over missing chunks: an int64-sized request with a handful of keys is cheap
    stored = {"0": [16, 32, 48, 64], "1": [16, 32, 48, 64]}
    hit = lookup_hit(SWA, 2**62, stored=stored)
    assert hit.end_token == 64


# ----------------------------------------------------------------------------------- the eagle pop


@pytest.mark.parametrize(
    ("groups", "dcp", "section", "hit"),
    [
        ([{**FA16, "drafter": True}, M16], 1, spec(), 80),  # vLLM run: the checkpoint 80 is served
        ([FA16, M16, DRAFT16], 2, spec(), 0),  # vLLM run: checkpoint 80, pop lands on 64: hit 0
        ([FA16, M16], 1, spec(), 80),  # vLLM run: no flag, no pop, the GPU still moved the checkpoint
        ([FA16, M16, DRAFT16], 2, None, 96),  # vLLM run: no drafter (the drafter group as a plain group)
        ([FA16, M16, DRAFT16], 1, spec(eagle_block_drop=False), 96),  # the drop disabled
    ],
)
def test_roundtrip_of_a_100_token_prompt(groups, dcp, section, hit):
    cfg = {"groups": [{k: v for k, v in g.items() if section or k != "drafter"} for g in groups],
           "parallel": {"tp": dcp, "dcp": dcp}, "offload": {}}
    if section:
        cfg["speculative"] = section
    assert roundtrip(kvgeom.resolve(cfg), 100).end_token == hit


def test_eagle_lookup_queries_one_chunk_more_and_pops_it():
    g = kvgeom.resolve({"groups": [{**FA16, "drafter": True}, M16], "offload": {}, "speculative": spec()})
    stored = {0: [16, 32, 48, 64], 1: [16, 32, 48]}
    # candidate 64 (n = 65): chunks to 64 stored, the extra chunk 80 is not -> pop 64 -> 48
    assert hits.lookup_hit(g, 65, stored=stored).end_token == 48
    # with chunk 80 stored the pop lands back on 64 (needs the Mamba state at 64)
    assert hits.lookup_hit(g, 81, stored={0: [16, 32, 48, 64, 80], 1: [64]}).end_token == 64


# the lookup's eagle helpers on FA 16 + Mamba 16 + a flagged FA 16 drafter, DCP 1: chunks of 16, group 2 is the
# only eagle group
EAGLE = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})


def test_eagle_pops_once_per_verified_candidate():
    from kvgeom.hits import eagle_pops

    verified = set()
    # the eagle group pops at a new candidate, then not again until the caller clears verified
    assert eagle_pops(EAGLE.offload.group(2), verified) == 1 and verified == {2}
    assert eagle_pops(EAGLE.offload.group(2), verified) == 0
    # a target group never pops and is not marked
    assert eagle_pops(EAGLE.offload.group(0), verified) == 0 and verified == {2}


@pytest.mark.parametrize(
    ("group", "m", "keyed_end", "pop", "end"),
    [
        (2, 64, 96, 1, 80),  # popping: one chunk (16) past the candidate 64
        (2, 64, 70, 1, 70),  # ... capped at the group's keyed end
        (2, 64, 96, 0, 64),  # already verified: the candidate itself
        (0, 64, 96, 0, 64),  # a target group: the candidate itself
    ],
)
def test_eagle_query_end(group, m, keyed_end, pop, end):
    from kvgeom.hits import eagle_query_end

    assert eagle_query_end(EAGLE.offload.group(group), m, keyed_end, pop) == end


def test_a_chunked_local_scan_asks_its_fixed_window_even_off_its_chunk_grid():
    # FA 8 + chunked local 16 (attention chunk 32), a 133-token request: full attention misses at 96, so the
    # candidate is 88, inside the chunked group's chunk [80, 96). vLLM 0.33 (load_window_size_in_chunks: no
    # right padding for chunked local) asks the window of cdiv(32, 16) = 2 chunks ending there, 96 and 80,
    # which hold [64, 88): hit 88 although the chunk ending at 64 is missing (run through vLLM's
    # OffloadingConnectorScheduler by kvgeom.conformance.vllm_pending; kvgeom asked 3 chunks and answered 48)
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 8},
                                   {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}],
                        "cache": {"retention_interval": None}, "offload": {}})
    stored = {0: [e for e in range(8, 133, 8) if e != 96], 1: [e for e in range(16, 133, 16) if e != 64]}
    assert lookup_hit(g, 133, stored=stored).hit_tokens == 88
    import numpy as np

    from kvgeom.batch import lookup_hits

    held = {i: np.array([[(j + 1) * 8 in ends for j in range(133 // 8)]]) for i, ends in stored.items()}
    assert lookup_hits(g, [133], stored=held).end_token.tolist() == [88]


def test_a_load_capped_clamp_off_the_window_chunk_grid_is_clamped_again():
    """Found by the batch-vs-scalar law after this session's merges: under ``max_load_tokens`` the clamp rounds
    the candidate down to each group's chunk, then re-aligns it to the Mamba chunk (2 here), which can leave it
    off the sliding window's chunk grid (3): 15 -> 14. The window group is then not at rest at 14 and must be
    clamped again (-> 12) in the next pass. Two speed-ups (skipping a group settled at the candidate, and no
    second pass after the first group's own run end) each skipped that pass and answered 14; the batch path and
    kvgeom before them answer 12."""
    from kvgeom.batch import lookup_hits

    geom = kvgeom.resolve({
        "groups": [{"kind": "sliding_window", "block_size": 3, "sliding_window": 1},
                   {"kind": "full_attention", "block_size": 1}, {"kind": "mamba", "block_size": 2}],
        "cache": {"max_model_len": 1}, "offload": {}})
    stored = {0: [3, 6, 9, 12, 15], 1: list(range(1, 17)), 2: list(range(2, 17, 2))}
    assert lookup_hit(geom, 17, stored=stored, max_load_tokens=17).end_token == 12
    assert lookup_hit(geom, 17, stored=stored).end_token == 14  # no cap: no chunk-grid clamp
    matrix = {g: np.isin(np.arange(1, 18), ends)[None, :] for g, ends in stored.items()}  # H = 1: column i is i + 1
    assert lookup_hits(geom, [17], stored=matrix, max_load_tokens=17).end_token.tolist() == [12]
