"""Edge rows for the prefill split (``kvgeom.prefill``), the simulator (``kvgeom.sim``) and ``kvgeom.geometry``.

Found by mutation testing (issue 19, ``docs/mutation.md``): each row pins a rule the other tables left open --
the field and numbers a bad argument is reported with, an edge of a bound, a branch only one geometry takes.
Expected values are derived from the rule named in each row's comment; where a row states what vLLM does it
restates a vLLM 0.33 run (``kvgeom.conformance.vllm_stores.run_prefill_split``), never a guess.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
import pytest

import kvgeom
import kvgeom.geometry
import kvgeom.ranks
from kvgeom import prefill
from kvgeom import sim as S
from kvgeom.errors import QueryError

FA16 = {"kind": "full_attention", "block_size": 16}
M16 = {"kind": "mamba", "block_size": 16}
DRAFT16 = {**FA16, "num_kv_heads": 4, "drafter": True}

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # FA 16 (DCP 2: span 32) + align Mamba 16: L 32, H = A = 16
# lookahead hashes, P = 3 (no drop): every checkpoint rule reads n - 3
MTP3 = kvgeom.resolve({"groups": [FA16, M16, DRAFT16],
                       "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}})
# blocks of one token: the only geometry where a checkpoint at position 1 is on the Mamba block grid
ONE = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1}, {"kind": "mamba", "block_size": 1}]})
# partial hash hits with H == L = 16 (FA 8 under DCP 2: span 16; Mamba 16 >= H under DCP)
H_EQ_L = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 8}, M16], "parallel": {"tp": 2, "dcp": 2}})
# H 16 < L 32 but no partial hash hits (no Mamba group)
NO_PARTIAL = kvgeom.resolve({"groups": [FA16, {"kind": "full_attention", "block_size": 32}]})
# multi-module MTP K 8 without the drop or lookahead hashes, H 8: the reserve P = 8 exceeds an H step
MTP8_H8 = kvgeom.resolve({"groups": [{**FA16, "drafter": True}, M16],
                          "cache": {"prefix_match_unit": 8, "retention_interval": 0},
                          "speculative": {"method": "mtp", "num_speculative_tokens": 8, "mtp_modules": 8,
                                          "eagle_block_drop": False, "lookahead_hashes": False}})
F16 = kvgeom.resolve({"groups": [FA16, M16], "cache": {"retention_interval": 0}, "offload": {}})


def _problem(call):
    with pytest.raises(QueryError) as e:
        call()
    (p,) = e.value.problems
    return p.code, p.field, p.values


# ------------------------------------------------------------------------------------------- prefill: bad input

# (call, code, field, values): the field names the argument to fix, the values hold its number
PREFILL_PROBLEMS = [
    (lambda: prefill.mamba_checkpoint_position(-1, 16, False), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: prefill.mamba_checkpoint_position(10, 0, False), "zero", "unit", {"unit": 0}),
    (lambda: prefill.mamba_checkpoint_position(10, -16, False), "negative", "unit", {"unit": -16}),
    # a string "false" is truthy and must not pass as the drop flag
    (lambda: prefill.mamba_checkpoint_position(10, 16, "false"), "not_a_bool", "drop", {}),
    (lambda: prefill.mamba_checkpoint_position(10, 16, False, -2), "negative", "lookahead_tokens",
     {"lookahead_tokens": -2}),
    (lambda: prefill.prompt_hash_checkpoint(SEED, -1), "negative", "num_prompt_tokens", {"num_prompt_tokens": -1}),
    (lambda: prefill.mamba_checkpoint(SEED, -1), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: prefill.prefill_chunk_ends(F16, -1), "negative", "num_prompt_tokens", {"num_prompt_tokens": -1}),
    (lambda: prefill.prefill_chunk_ends(F16, 100, num_computed_tokens=-1), "negative", "num_computed_tokens",
     {"num_computed_tokens": -1}),
    # resuming past the prompt: both numbers are quoted
    (lambda: prefill.prefill_chunk_ends(F16, 100, num_computed_tokens=101), "out_of_range", "num_computed_tokens",
     {"num_computed_tokens": 101, "num_prompt_tokens": 100}),
    # a budget of 0 names the argument (and, in a list, the step) and quotes the 0 under the argument's name
    (lambda: prefill.prefill_chunk_ends(F16, 100, max_num_batched_tokens=0), "out_of_range", "max_num_batched_tokens",
     {"max_num_batched_tokens": 0}),
    (lambda: prefill.prefill_chunk_ends(F16, 100, max_num_batched_tokens=[16, 0]), "out_of_range",
     "max_num_batched_tokens[1]", {"max_num_batched_tokens": 0}),
    (lambda: prefill.prefill_chunk_ends(F16, 100, max_num_batched_tokens=[16, -3]), "negative",
     "max_num_batched_tokens[1]", {"max_num_batched_tokens[1]": -3}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), PREFILL_PROBLEMS)
def test_prefill_problems_name_the_argument_and_its_numbers(call, code, field, values):
    assert _problem(call) == (code, field, values)


# ------------------------------------------------------------------------------------------- prefill: rules


@pytest.mark.parametrize(
    ("geom", "n", "stop"),
    [
        # partial hash hits on but H == L: the prefill has no finer grid to stop on (0), though the H-grid
        # checkpoint rdown(16, 16) = 16 exists
        (H_EQ_L, 17, 0),
        # H 16 below L 32 but no partial hash hits (no Mamba group): no tail stop either
        (NO_PARTIAL, 17, 0),
        (SEED, 17, 16),  # both: the stop is the prompt's H-grid checkpoint
    ],
)
def test_prefill_tail_stop_needs_partial_hits_and_h_below_l(geom, n, stop):
    assert prefill.prefill_tail_stop(geom, n) == stop


def _checkpoint(geom, n, prompt=None):
    c = prefill.mamba_checkpoint(geom, n, num_prompt_tokens=prompt)
    return c.position, c.unit, c.shift, c.last_cacheable, c.prefill_chunks, c.state_block


@pytest.mark.parametrize(
    ("geom", "n", "prompt", "want"),
    [
        # an empty request: no checkpoint, no shift, nothing cacheable, no chunk, no state block
        (SEED, 0, None, (0, 16, 0, 0, (), None)),
        # unit = A = 16; last cacheable boundary on the engine block grid 16: rdown(100 - 1, 16) = 96
        (SEED, 100, None, (96, 16, 0, 96, (96, 4), 5)),
        # a request of 98 tokens with a 50-token prompt: the checkpoint reads the prefill end max(50, 98 - 1) = 97
        # (rdown(96, 16) = 96, not rdown(95, 16) = 80), and the prefill chunks cover the prompt alone
        (SEED, 98, 50, (96, 16, 0, 96, (50,), 5)),
        # lookahead hashes P = 3: the last cacheable boundary also reads n - 3: rdown(95, 16) = 80
        (MTP3, 98, None, (80, 16, 16, 80, (80, 18), 4)),
        # blocks of one token: position 1 is on the Mamba grid, held by block 1 // 1 - 1 = 0
        (ONE, 2, None, (1, 1, 0, 1, (1, 1), 0)),
        # multi-module MTP P = 8 over H 8: the reserve trims the first chunk (to the H checkpoint 8) to 8 - 7 = 1,
        # which still schedules a token; the next chunk would trim to nothing, so the total split keeps it
        # (prefill_chunk_ends raises prefill_stalls at 1, below)
        (MTP8_H8, 9, None, (8, 8, 0, 0, (1, 7, 1), None)),
    ],
)
def test_mamba_checkpoint_fields(geom, n, prompt, want):
    assert _checkpoint(geom, n, prompt) == want


# H 32 above the engine block 16 (FA 16 under DCP 4: span 64; Mamba 32): the H-grid checkpoint rdown(48, 32) = 32
# lies below the last cacheable boundary rdown(48, 16) = 48, so it does not stop the prefill
H32_B16 = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 32}], "parallel": {"tp": 4, "dcp": 4},
                          "offload": {}})


@pytest.mark.parametrize(("n", "ends"), [(49, (48, 49)), (64, (48, 64)), (81, (80, 81))])
def test_an_h_checkpoint_below_the_last_cacheable_boundary_is_no_stop(n, ends):
    # vLLM 0.33 runs (kvgeom.conformance.vllm_stores.run_prefill_split, unbounded budget): [48, 49], [48, 64],
    # [80, 81]; mamba_checkpoint's unbounded split is the same
    assert prefill.prefill_chunk_ends(H32_B16, n) == ends
    assert tuple(accumulate(prefill.mamba_checkpoint(H32_B16, n).prefill_chunks)) == ends


def test_mamba_checkpoint_state_block_is_an_int_block_index():
    # position 16 on the Mamba block grid 16: block 16 // 16 - 1 = 0, an int (a block id, never 0.0)
    c = prefill.mamba_checkpoint(SEED, 17)
    assert (c.position, c.state_block) == (16, 0) and type(c.state_block) is int


def test_the_reserve_stall_of_the_total_split_is_prefill_stalls_in_the_split():
    # the same MTP 8 geometry: the first step schedules [0, 1), the second is trimmed to nothing
    assert _problem(lambda: prefill.prefill_chunk_ends(MTP8_H8, 9)) == (
        "prefill_stalls", "num_prompt_tokens", {"num_prompt_tokens": 9, "stalled_at": 1})


# ------------------------------------------------------------------------------------------- sim: bad input


DENSE = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
_BIG = S.MAX_SIM_TOKENS + 1

SIM_PROBLEMS = [
    # past the simulator's size limit: the argument, its value and the limit
    (lambda: S.run_scenario(DENSE, _BIG), "result_too_large", "num_tokens", {"num_tokens": _BIG, "limit": 1 << 16}),
    (lambda: S.run_request(DENSE, 10, first_tokens=_BIG), "result_too_large", "first_tokens",
     {"first_tokens": _BIG, "limit": 1 << 16}),
    (lambda: S.Simulator(DENSE).prefill(_BIG), "result_too_large", "num_tokens",
     {"num_tokens": _BIG, "limit": 1 << 16}),
    (lambda: S.run_scenario(DENSE, -1), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: S.run_scenario(DENSE, 10, local_computed_tokens=-1), "negative", "local_computed_tokens",
     {"local_computed_tokens": -1}),
    (lambda: S.run_request(DENSE, -2), "negative", "num_tokens", {"num_tokens": -2}),
    (lambda: S.Simulator(DENSE).prefill(-1), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: S.GPUPrefixCache(DENSE).cache_request(-5), "negative", "num_tokens", {"num_tokens": -5}),
    # eviction lists: a string is no list of bools, an int is no bool, a list longer than any run is refused
    (lambda: S.run_scenario(DENSE, 64, evict="abc"), "bad_evict", "evict", {}),
    (lambda: S.run_scenario(DENSE, 64, evict=[1]), "not_a_bool", "evict[]", {}),
    (lambda: S.run_scenario(DENSE, 64, evict=[False] * _BIG), "result_too_large", "evict", {}),
    (lambda: S.run_request(DENSE, 64, evict_gpu="x"), "bad_evict_gpu", "evict_gpu", {}),
    (lambda: S.run_request(DENSE, 64, evict_tier=[2]), "not_a_bool", "evict_tier[]", {}),
    # chunk ends: not both ways at once; strictly increasing up to num_tokens
    (lambda: S.GPUPrefixCache(DENSE).cache_request(64, chunk_ends=[64], max_num_batched_tokens=16),
     "conflicting_arguments", "chunk_ends", {}),
    (lambda: S.GPUPrefixCache(DENSE).cache_request(64, chunk_ends=[32]), "bad_chunk_ends", "chunk_ends",
     {"num_tokens": 64}),
    (lambda: S.GPUPrefixCache(DENSE).cache_request(64, chunk_ends=[32, 32, 64]), "bad_chunk_ends", "chunk_ends",
     {"num_tokens": 64}),
    (lambda: S.GPUPrefixCache(DENSE).cache_request(64, chunk_ends=[]), "bad_chunk_ends", "chunk_ends",
     {"num_tokens": 64}),
    # geometries the simulator does not model
    (lambda: S.Simulator(kvgeom.resolve({"groups": [FA16]})), "no_offload", "offload", {}),
    (lambda: S.Simulator(kvgeom.resolve({"groups": [FA16, M16], "cache": {"prefix_caching": False}, "offload": {}})),
     "sim_unsupported_group", "group", {"group": 1}),
    # the checks' own arguments
    (lambda: S.Simulator(DENSE).check_restored({"end_token": -1, "hit_tokens": 0, "groups": []}, num_tokens=3),
     "negative", "end_token", {"end_token": -1}),
    (lambda: S.Simulator(DENSE).check_restored({"end_token": 1, "hit_tokens": 0, "groups": []}, num_tokens=-3),
     "negative", "num_tokens", {"num_tokens": -3}),
    (lambda: S.GPUPrefixCache(DENSE).check_adopted(kvgeom.prefix_hit(DENSE, 10, {}), end_token=-1),
     "negative", "end_token", {"end_token": -1}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), SIM_PROBLEMS)
def test_sim_problems_name_the_argument_and_its_numbers(call, code, field, values):
    assert _problem(call) == (code, field, values)


def test_the_sim_size_limit_is_inclusive():
    # MAX_SIM_TOKENS itself is a request the simulator runs (cheap here: prefix caching off caches nothing)
    cache = S.GPUPrefixCache(kvgeom.resolve({"groups": [FA16], "cache": {"prefix_caching": False}}))
    cache.cache_request(S.MAX_SIM_TOKENS)
    assert cache.entries == {} and cache.chunk_ends == frozenset()


# ------------------------------------------------------------------------------------------- sim: more geometries

SW = {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}
CL = {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}
_D = {"retention_interval": None}
SIM_GEOMETRIES = {
    # DCP 1: one copy per position, pages keyed by no rank
    "dcp1": {"groups": [FA16, M16], "offload": {}, "cache": _D},
    # DCP 2 with a sliding-window group that is not dealt: two positional groups with different placements
    "sw-dcp2": {"groups": [FA16, {**SW, "dcp_sharded": False}], "parallel": {"tp": 2, "dcp": 2}, "offload": {},
                "cache": _D},
    "sw": {"groups": [FA16, SW], "offload": {}, "cache": _D},
    "chunked": {"groups": [FA16, CL], "offload": {}, "cache": _D},
    # H 16 under L 64: partial hash hits, Mamba keys on the H grid
    "fine64": {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
               "cache": {"prefix_match_unit": 16, "retention_interval": None}, "offload": {}},
    "k2": {**kvgeom.DEFAULT_CONFIG, "cache": _D, "offload": {"blocks_per_chunk": 2}},
    "interleave16": {**kvgeom.DEFAULT_CONFIG, "cache": _D, "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 16}},
}


@pytest.mark.parametrize("name", sorted(SIM_GEOMETRIES))
@pytest.mark.parametrize(("n", "local"), [(65, 0), (100, 40), (130, 70)])
def test_kvgeom_plans_pass_the_simulator_on_every_modelled_family(name, n, local):
    """The simulator's contract: kvgeom's own store, hit and admission plans restore exactly what a cold run
    holds (no tier, restore or adoption problem) -- on each positional family, DCP layout and chunk size."""
    g = kvgeom.resolve(SIM_GEOMETRIES[name])
    report = S.run_scenario(g, n, local_computed_tokens=local)
    assert report.ok, (report.tier_problems, report.restore_problems)
    request = S.run_request(g, n + 20, first_tokens=n, evict_gpu=lambda group, end: end > 48)
    assert request.ok, (request.local_problems, request.tier_problems, request.restore_problems)


def test_a_store_plan_naming_a_mamba_block_never_computed_is_reported():
    # prefill 64 on Mamba 16 fills blocks 0-3 (a row of 4); block 4, just past the row, holds no state
    sim = S.Simulator(DENSE)
    sim.prefill(64)
    assert len(sim.groups[1].row) == 4
    sim.store({"groups": [{"index": 1, "end_tokens": [64], "block_entries": [[4]]}]})
    assert sim.check_tier() == ["group 1: Mamba key ending at 64 holds the state after None tokens"]


def test_a_store_plan_naming_an_attention_entry_never_computed_is_reported():
    # prefill 32 fills attention entry 0 (span 32, a row of 1); entry 1, just past the row, was never allocated
    sim = S.Simulator(DENSE)
    sim.prefill(32)
    assert len(sim.groups[0].row) == 1
    sim.store({"groups": [{"index": 0, "end_tokens": [64], "block_entries": [[1]]}]})
    assert sim.check_tier() == ["group 0: key ending at 64 does not hold exactly [32, 64)"]


def test_a_rank_page_never_written_is_stored_empty():
    # cp_interleave 16 under DCP 2: positions 0-15 of entry 0 live on rank 0, 16-31 on rank 1; after 10 tokens
    # rank 1 has no page yet, and a key stored from entry 0 holds empty slots there
    g = kvgeom.resolve(SIM_GEOMETRIES["interleave16"])
    sim = S.Simulator(g)
    sim.prefill(10)
    sim.store({"groups": [{"index": 0, "end_tokens": [32], "block_entries": [[0]]}]})
    assert sim.tier[(1, 0)] == {0: [list(range(10)) + [-1] * 6], 1: [[-1] * 16]}
    assert sim.check_tier() == ["group 0: key ending at 32 does not hold exactly [0, 32)"]


def test_check_tier_reads_every_key_past_a_good_mamba_key_and_an_off_grid_key():
    # sorted by hash index: the good Mamba key 16, the attention key 48 off the chunk grid 32, then the key 64
    # filled from entry 0 (positions [0, 32) where [32, 64) belongs): each is reported, none hides the next
    sim = S.Simulator(DENSE)
    sim.prefill(64)
    sim.store({"groups": [{"index": 1, "end_tokens": [16], "block_entries": [[0]]},
                          {"index": 0, "end_tokens": [48, 64], "block_entries": [[1], [0]]}]})
    problems = sim.check_tier()
    assert problems[0] == "group 0: key ending at 48 is not on the chunk grid 32"
    # 32 positions of entry 0 each in the wrong entry (16 per rank), then the missing prefix
    assert len(problems) == 34 and problems[-1] == "group 0: key ending at 64 does not hold exactly [32, 64)"
    assert problems[1] == ("group 0: key ending at 64 holds position 0 at (entry 1, rank 0, offset 0), but it is "
                           "dealt to Placement(column=0, rank=0, offset=0)")


# ------------------------------------------------------------------------------------------- GPU prefix cache checks


def test_check_adopted_reports_uncached_entries_missing_positions_and_wrong_states():
    # a cold run of 64 caches attention 32, 48 (the partial H entry), 64 and Mamba 48, 64; a hit claiming 96
    # adopts entries nobody cached
    c = S.GPUPrefixCache(DENSE)
    c.cache_request(64)
    assert c.resident() == {"0": [32, 48, 64], "1": [48, 64]}
    hit = kvgeom.prefix_hit(DENSE, 100, {"0": [32, 64, 96], "1": [96]})
    uncached = ["group 0: adopts the entry ending at 96, which is not cached",
                "group 0: resuming at 96 needs positions [0, 96); 32 are in no adopted entry (first 64)",
                "group 1: adopts the entry ending at 96, which is not cached"]
    assert c.check_adopted(hit) == [*uncached, "group 1: resuming at 96 adopts Mamba states [], not [96]"]
    assert c.check_adopted(hit, states=False) == uncached  # states=False: the Mamba state is not asked
    # the real hit (64), resumed 16 tokens later: positions 64-79 and the state after 80 are missing
    real = kvgeom.prefix_hit(DENSE, 100, c.resident())
    assert c.check_adopted(real) == []
    assert c.check_adopted(real, end_token=80) == [
        "group 0: resuming at 80 needs positions [0, 80); 16 are in no adopted entry (first 64)",
        "group 1: resuming at 80 adopts Mamba states [64], not [80]"]


def test_check_adopted_asks_a_sliding_window_for_its_last_window_only():
    # window 32: resuming at 96 needs [96 - 31, 96) = [65, 96); entry 80 (64-79) evicted after the lookup
    g = kvgeom.resolve({"groups": [FA16, SW], "cache": _D})
    c = S.GPUPrefixCache(g)
    c.cache_request(100)
    hit = kvgeom.prefix_hit(g, 120, c.resident())
    c.evict(lambda group, end: (group, end) != (1, 80))
    assert c.check_adopted(hit) == ["group 1: adopts the entry ending at 80, which is not cached",
                                    "group 1: resuming at 96 needs positions [65, 96); 15 are in no adopted entry "
                                    "(first 65)"]


def test_check_adopted_asks_a_chunked_local_group_for_its_current_chunk_only():
    # chunk 32: resuming at 90 needs [90 // 32 * 32, 90) = [64, 90); at 100, [96, 100)
    g = kvgeom.resolve({"groups": [FA16, CL], "cache": _D})
    c = S.GPUPrefixCache(g)
    c.cache_request(100)
    resident = c.resident()
    assert c.check_adopted(kvgeom.prefix_hit(g, 120, resident), end_token=100) == [
        "group 0: resuming at 100 needs positions [0, 100); 4 are in no adopted entry (first 96)",
        "group 1: resuming at 100 needs positions [96, 100); 4 are in no adopted entry (first 96)"]
    hit = kvgeom.prefix_hit(g, 120, {"0": resident["0"], "1": [16, 32, 48, 64, 80]})
    assert c.check_adopted(hit, end_token=90) == [
        "group 1: resuming at 90 needs positions [64, 90); 26 are in no adopted entry (first 64)"]


def test_check_adopted_asks_a_short_sliding_hit_from_position_zero():
    # window 32 (needs 31 positions): resuming at 16 needs [max(16 - 31, 0), 16) = [0, 16), position 0 included
    g = kvgeom.resolve({"groups": [FA16, SW], "cache": _D})
    c = S.GPUPrefixCache(g)
    c.cache_request(100)
    hit = kvgeom.prefix_hit(g, 20, c.resident())
    c.evict(lambda group, end: (group, end) != (1, 16))
    assert c.check_adopted(hit) == ["group 1: adopts the entry ending at 16, which is not cached",
                                    "group 1: resuming at 16 needs positions [0, 16); 16 are in no adopted entry "
                                    "(first 0)"]


def test_check_adopted_needs_nothing_of_a_chunked_local_group_at_a_chunk_boundary():
    # chunk 32: resuming at 96 = 3 * 32 needs [96, 96), nothing; the hit adopts no chunked-local entry
    g = kvgeom.resolve({"groups": [FA16, CL], "cache": _D})
    c = S.GPUPrefixCache(g)
    c.cache_request(100)
    hit = kvgeom.prefix_hit(g, 120, c.resident())
    assert (hit.hit_tokens, hit.groups[1].end_tokens) == (96, ())
    assert c.check_adopted(hit) == []


@pytest.mark.parametrize("first", [{"kind": "mamba", "block_size": 16}, {**FA16, "prefix_cacheable": False}],
                         ids=["mamba-first", "not-cacheable-first"])
def test_check_adopted_checks_the_groups_after_a_mamba_or_non_cacheable_group(first):
    # the group listed first is settled (Mamba) or skipped (not prefix-cacheable); the group after it still is
    # checked: its entry ending at 32 (80 for the window) was evicted after the lookup
    second, gone = (FA16, 32) if first["kind"] == "mamba" else (SW, 80)
    g = kvgeom.resolve({"groups": [first, second], "cache": _D})
    c = S.GPUPrefixCache(g)
    c.cache_request(100)
    hit = kvgeom.prefix_hit(g, 120, c.resident())
    c.evict(lambda group, end: (group, end) != (1, gone))
    need = "[0, 96); 16 are in no adopted entry (first 16)" if gone == 32 else \
        "[65, 96); 15 are in no adopted entry (first 65)"
    assert c.check_adopted(hit) == [f"group 1: adopts the entry ending at {gone}, which is not cached",
                                    f"group 1: resuming at 96 needs positions {need}"]

# ------------------------------------------------------------------------------------------- geometry


def test_the_old_resolve_door_and_unknown_names_of_kvgeom_geometry():
    # kvgeom.geometry.resolve is served at call time (PEP 562) and is kvgeom.resolve; any other name is unknown
    assert kvgeom.geometry.resolve is kvgeom.resolve
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        kvgeom.geometry.no_such_name  # noqa: B018


class _Index(int):
    """An int subclass (as an IntEnum member is): an index, though not of type int itself."""


@pytest.mark.parametrize("index", [0, 1, _Index(0), _Index(1)])
def test_geometry_group_answers_each_index_in_range(index):
    assert SEED.group(index) is SEED.groups[int(index)]


# two groups: 0 and 1 are the indices; a bool, a string and a numpy integer are not group indices here
@pytest.mark.parametrize("index", [2, -1, True, "0", np.int64(1)])
def test_geometry_group_refuses_what_is_no_index_of_it(index):
    code, field, values = _problem(lambda: SEED.group(index))
    assert (code, field) == ("no_such_group", "group") and values == {"index": index}
    assert type(values["index"]) is type(index)


def test_offload_group_lookup():
    # get: None for a non-int (True is no group index, though True == 1) or an index without offloading
    assert SEED.offload.get(True) is None and SEED.offload.get("1") is None and SEED.offload.get(5) is None
    assert SEED.offload.get(1) is SEED.offload.groups[1]
    with pytest.raises(kvgeom.KVGeomError) as e:
        SEED.offload.group(5)
    (p,) = e.value.problems
    assert (p.code, p.field, p.values) == ("group_not_offloaded", "group", {"index": 5})


def test_geometry_methods_answer_as_their_functions():
    """The Geometry methods are the documented dict doors to the rule functions (seed geometry)."""
    assert SEED.key_map(64)["groups"][1]["keys"][0] == {"chunk": 0, "hash_index": 0, "end_token": 16, "state_block": 0}
    assert SEED.prefix_hit({"num_tokens": 65, "resident": {"0": [32, 64], "1": [48]}}) == {
        "hit_tokens": 48, "groups": [{"index": 0, "blocks": [32, 64]}, {"index": 1, "blocks": [48]}]}
    assert SEED.plan_hit({"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}) == {
        "hit_tokens": 48, "end_token": 48,
        "groups": [{"index": 0, "load_keys": [32, 64], "block_entries": [0, 1], "state_block": None},
                   {"index": 1, "load_keys": [48], "block_entries": [2], "state_block": 2}]}
    plain, named = SEED.to_report(), SEED.to_report(vllm_names=True)
    assert set(named) - set(plain) == {"enable_partial_hash_hits", "cache_hit_alignment_tokens"}


# ------------------------------------------------------------------------------- sim: load and check_restored


def _stored(geom, n):
    """A tier filled from a cold prefill of n tokens split 16 a step (a Mamba state at every block), GPU reset."""
    sim = S.Simulator(geom)
    sim.prefill(n)
    ends = kvgeom.prefill_chunk_ends(geom, n, max_num_batched_tokens=16)
    sim.store(kvgeom.hits.plan_store(geom, num_tokens=n, num_computed_tokens=n, chunk_ends=ends))
    sim.reset()
    return sim


_MISSING_0 = "group 0: position 0 is missing after the load (column 0, rank 0, offset 0 holds None; a cold run holds 0)"


@pytest.mark.parametrize(
    ("plan", "problems"),
    [
        # no hit (hit_tokens 0): nothing was restored, nothing to check, whatever the end token says
        ({"end_token": 32, "hit_tokens": 0, "groups": []}, []),
        # a hit of 32 (or of 1) with nothing loaded: position 0 and the Mamba state the resume reads are missing
        ({"end_token": 32, "hit_tokens": 32, "groups": []},
         [_MISSING_0, "group 1: a request resuming at 32 reads Mamba block 1, which holds the state after None tokens "
                      "(a cold run holds 32)"]),
        ({"end_token": 1, "hit_tokens": 1, "groups": []},
         [_MISSING_0, "group 1: a request resuming at 1 reads Mamba block 0, which holds the state after None tokens "
                      "(a cold run holds 1)"]),
        # the Mamba state after 16 loaded into block 0, but a resume at 32 reads block 1 (past the row)
        ({"end_token": 32, "hit_tokens": 32,
          "groups": [{"index": 1, "load_keys": [16], "block_entries": [0], "state_block": 0}]},
         [_MISSING_0, "group 1: a request resuming at 32 reads Mamba block 1, which holds the state after None tokens "
                      "(a cold run holds 32)"]),
    ],
)
def test_check_restored_reports_what_the_load_left_out(plan, problems):
    sim = _stored(DENSE, 64)
    sim.load(plan)
    assert sim.check_restored(plan, num_tokens=64) == problems


def test_check_restored_wants_the_mamba_hit_below_the_request():
    # the hit of 48 is right for a 64-token request; for a 48-token one the last token would not be recomputed
    sim = _stored(DENSE, 64)
    plan = kvgeom.hits.plan_hit(DENSE, {"num_tokens": 64, "stored": sim.tier_end_tokens()})
    sim.load(plan)
    assert plan.hit.end_token == 48 and sim.check_restored(plan, num_tokens=64) == []
    assert sim.check_restored(plan, num_tokens=48) == ["group 1: Mamba restored at 48, not below num_tokens=48"]


def test_check_restored_checks_the_groups_after_a_mamba_group():
    # Mamba first, attention second (DCP 1): the Mamba state after 32 is right, attention was never loaded
    g = kvgeom.resolve({"groups": [M16, FA16], "offload": {}, "cache": _D})
    sim = _stored(g, 64)
    plan = {"end_token": 32, "hit_tokens": 32,
            "groups": [{"index": 0, "load_keys": [32], "block_entries": [1], "state_block": 1}]}
    sim.load(plan)
    assert sim.check_restored(plan, num_tokens=64) == [
        "group 1: position 0 is missing after the load (column 0, rank None, offset 0 holds None; a cold run holds 0)"]


def test_load_refuses_every_mamba_key_the_tier_lacks():
    # Mamba key 64 is held, 80 is not: the load names the group and the end token
    sim = _stored(DENSE, 64)
    plan = {"end_token": 80, "hit_tokens": 80,
            "groups": [{"index": 1, "load_keys": [64, 80], "block_entries": [4], "state_block": 4}]}
    assert _problem(lambda: sim.load(plan)) == ("sim_missing_key", "load_keys", {"group": 1, "end_token": 80})


def test_load_writes_only_the_entries_the_plan_names():
    # k = 2: the attention chunk ending at 64 spans entries 0 and 1; a plan naming entry 1 alone writes entry 1
    # (block id 2, after id 1 for entry 0), rank 0 the even and rank 1 the odd positions of [32, 64)
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": _D, "offload": {"blocks_per_chunk": 2}})
    sim = _stored(g, 64)
    sim.load({"end_token": 64, "hit_tokens": 64,
              "groups": [{"index": 0, "load_keys": [64], "block_entries": [1], "state_block": None}]})
    assert sim.pages == {(0, 2): list(range(32, 64, 2)), (1, 2): list(range(33, 64, 2))}


def _by_column(sim):
    """What the GPU holds per (group, column[, rank]), independent of the block ids the simulator handed out."""
    out = {}
    for gs in sim.groups.values():
        for col, block in enumerate(gs.row):
            if gs.mamba:
                out[(gs.index, col)] = sim.states.get(block)
            else:
                out.update({(gs.index, col, r): page for (r, b), page in sim.pages.items() if b == block})
    return out


def test_a_prefill_in_two_steps_leaves_what_one_step_leaves():
    # computing [0, 20) then [20, 64) writes the same positions and Mamba states as [0, 64) at once
    two, one = S.Simulator(DENSE), S.Simulator(DENSE)
    two.prefill(20)
    two.prefill(64)
    one.prefill(64)
    assert two.computed == one.computed == 64
    assert _by_column(two) == _by_column(one)


def test_a_store_plan_with_fewer_block_entries_than_end_tokens_is_refused():
    # each end token needs its block entries; a short list is a broken plan, not a shorter store
    sim = S.Simulator(DENSE)
    sim.prefill(64)
    with pytest.raises(ValueError, match="shorter"):
        sim.store({"groups": [{"index": 0, "end_tokens": [32, 64], "block_entries": [[0]]}]})


@pytest.mark.parametrize(
    ("bits", "gone"),
    [
        # stored keys in (group, end_token) order: (0, 32), (0, 64), (1, 16), (1, 32), (1, 48), (1, 64)
        ([False] * 5 + [True], {(1, 64)}),
        ([False, True], {(0, 64)}),  # keys past the list stay
        ([True, False, True], {(0, 32), (1, 16)}),
    ],
)
def test_eviction_bits_apply_in_group_then_end_token_order(bits, gone):
    """run_scenario's list form of ``evict`` is the predicate naming the same keys (16-token budget: a Mamba key at
    every block boundary)."""
    by_bits = S.run_scenario(DENSE, 65, evict=bits, max_num_batched_tokens=16)
    by_keys = S.run_scenario(DENSE, 65, evict=lambda g, e: (g, e) in gone, max_num_batched_tokens=16)
    assert by_bits.ok and by_keys.ok
    assert by_bits.hit_plan.to_dict() == by_keys.hit_plan.to_dict()
    assert by_bits.hit_plan.hit.end_token < 64  # every row evicts a key the full hit needs


def test_a_token_budget_without_a_mamba_group_splits_nothing():
    # the budget only decides where Mamba states exist; a geometry without Mamba runs as without a budget
    g = kvgeom.resolve({"groups": [FA16], "offload": {}})
    assert S.run_scenario(g, 64, max_num_batched_tokens=16) == S.run_scenario(g, 64)


def test_run_scenario_reports_its_store_plan_and_empty_problem_tuples():
    # the report carries the store plan it followed and the checks' problems as tuples (empty: all good)
    report = S.run_scenario(DENSE, 65)
    assert report.store_plan == kvgeom.hits.plan_store(DENSE, num_tokens=65, num_computed_tokens=65)
    assert (report.tier_problems, report.restore_problems) == ((), ())


def test_gpu_prefix_cache_entries_hold_their_own_block_only():
    # attention span 32: the entry ending at 64 holds block 1 = [32, 64), the partial entry at 48 [32, 48); a Mamba
    # entry holds the state after its end token; before any request nothing is cached and no chunk ended
    c = S.GPUPrefixCache(DENSE)
    assert c.entries == {} and c.chunk_ends == frozenset()
    c.cache_request(64)
    assert c.entries == {(0, 32): tuple(range(32)), (0, 48): tuple(range(32, 48)), (0, 64): tuple(range(32, 64)),
                         (1, 48): 48, (1, 64): 64}


@pytest.mark.parametrize(
    ("cfg", "n", "entries"),
    [
        # prefix caching off: a cold run caches nothing
        ({"groups": [FA16], "cache": {"prefix_caching": False}}, 64, {}),
        # a cross-attention group is prefix-cacheable in its spec but has no prefix-cache entries; attention does
        ({"groups": [FA16, {"kind": "cross_attention", "block_size": 16}]}, 17, {(0, 16): tuple(range(16))}),
        # blocks of one token: a one-token prompt still caches its one attention block (no Mamba state: the
        # Mamba group's cacheable prefix of a one-token prompt is empty)
        ({"groups": [{"kind": "full_attention", "block_size": 1}, {"kind": "mamba", "block_size": 1}]}, 1,
         {(0, 1): (0,)}),
        # the partial H entry is the last H boundary below n: 65 -> 64, a full attention block, so no partial 48
        ({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}}, 65,
         {(0, 32): tuple(range(32)), (0, 64): tuple(range(32, 64)), (1, 64): 64}),
    ],
)
def test_gpu_prefix_cache_entries_of_a_cold_run(cfg, n, entries):
    c = S.GPUPrefixCache(kvgeom.resolve(cfg))
    c.cache_request(n)
    assert c.entries == entries


@pytest.mark.parametrize(("cfg", "rank"), [(kvgeom.DEFAULT_CONFIG, 0),
                                           ({"groups": [FA16, M16], "offload": {}}, None)])
def test_check_restored_reports_a_slot_holding_another_columns_position(cfg, rank):
    # after a right load, column 0's page (of rank 0 under DCP 2, of no rank under DCP 1) is overwritten with
    # column 1's page: its first slot holds a position dealt to column 1
    g = kvgeom.resolve({**cfg, "cache": _D})
    sim = _stored(g, 64)
    plan = kvgeom.hits.plan_hit(g, {"num_tokens": 64, "stored": sim.tier_end_tokens()})
    sim.load(plan)
    row = sim.groups[0].row
    sim.pages[(rank, row[0])] = list(sim.pages[(rank, row[1])])
    wrong = sim.pages[(rank, row[0])][0]
    problems = sim.check_restored(plan, num_tokens=64)
    dealt = kvgeom.ranks.dcp_placement(g, 0, wrong)
    assert dealt.column == 1
    want = f"group 0: slot (column 0, rank {rank}, offset 0) holds position {wrong}, which is dealt to {dealt}"
    assert want in problems



def test_check_restored_reads_every_rank_of_a_column_after_a_missing_page():
    # an injected fault after a right load (DCP 2): column 0's page of rank 0 is gone and its page of rank 1 is
    # overwritten with column 1's; the checker (every non-empty slot of a written entry holds the position dealt to
    # it) still reads rank 1 and reports its first slot
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": _D})
    sim = _stored(g, 64)
    plan = kvgeom.hits.plan_hit(g, {"num_tokens": 64, "stored": sim.tier_end_tokens()})
    sim.load(plan)
    row = sim.groups[0].row
    del sim.pages[(0, row[0])]
    sim.pages[(1, row[0])] = list(sim.pages[(1, row[1])])
    wrong = sim.pages[(1, row[0])][0]
    dealt = kvgeom.ranks.dcp_placement(g, 0, wrong)
    assert (dealt.column, dealt.rank) == (1, 1)
    problems = sim.check_restored(plan, num_tokens=64)
    assert f"group 0: slot (column 0, rank 1, offset 0) holds position {wrong}, which is dealt to {dealt}" in problems


def test_run_request_first_budget_decides_the_gpu_mamba_states():
    # vLLM run (the run_request doctest): budget 16, Mamba entries past 48 evicted from the GPU: GPU hit 32,
    # connector 64 more
    r = S.run_request(DENSE, 100, max_num_batched_tokens=16, evict_gpu=lambda g, e: g == 1 and e > 48)
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens, r.ok) == (32, 64, True)


@pytest.mark.parametrize(("bits", "gone"), [([False, True], {(0, 48)}),
                                           ([True, False, False, False, True], {(0, 32), (1, 64)})])
def test_run_request_eviction_bits_are_the_predicate_on_sorted_entries(bits, gone):
    # GPU entries of a cold 64-token run, sorted: (0, 32), (0, 48), (0, 64), (1, 48), (1, 64)
    by_bits = S.run_request(DENSE, 100, first_tokens=64, evict_gpu=bits)
    by_keys = S.run_request(DENSE, 100, first_tokens=64, evict_gpu=lambda g, e: (g, e) in gone)
    assert by_bits.plan.to_dict() == by_keys.plan.to_dict()
    assert by_bits.ok and by_keys.ok


def test_eviction_lists_are_read_up_to_the_limit_only():
    import itertools

    # an endless iterator is refused after MAX_SIM_TOKENS + 1 items; a list of exactly MAX_SIM_TOKENS is taken
    assert _problem(lambda: S.run_scenario(DENSE, 64, evict=itertools.repeat(False)))[:2] == ("result_too_large",
                                                                                              "evict")
    assert S.run_scenario(DENSE, 64, evict=[False] * S.MAX_SIM_TOKENS).ok


def test_a_group_without_prefix_cache_entries_does_not_stop_the_next_one():
    c = S.GPUPrefixCache(kvgeom.resolve({"groups": [{"kind": "circular_buffer", "block_size": 16}, FA16]}))
    c.cache_request(17)
    assert c.entries == {(1, 16): tuple(range(16))}


def test_run_request_reports_empty_problem_tuples_on_a_clean_run():
    # the run_request doctest (vLLM run): budget 16, GPU Mamba entries past 48 evicted: local 32, external 64
    r = S.run_request(DENSE, 100, max_num_batched_tokens=16, evict_gpu=lambda g, e: g == 1 and e > 48)
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (32, 64)
    assert (r.local_problems, r.tier_problems, r.restore_problems) == ((), (), ())


def test_run_request_without_an_offload_section_has_no_tier():
    # FA16 + Mamba16, dense retention, no offload (tests/test_store_conformance.py GPU_ROWS "dense-no-offload",
    # vLLM run: GPU entries FA 16..96 and Mamba 96): a 100-token request adopts 96 locally, nothing external
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                        "cache": {"retention_interval": None}})
    r = S.run_request(g, 100)
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (96, 0)
    assert (r.local_problems, r.tier_problems, r.restore_problems) == ((), (), ())


def test_run_request_first_budget_decides_the_tier_mamba_states():
    # FA16 + Mamba16, dense retention, the first request (100 tokens) prefilled 16 tokens a step. vLLM run (the
    # store-then-lookup harness, the tier's Mamba key at 96 evicted, a fresh GPU): it stored Mamba 16..96, and a
    # 100-token request over what is left hits 80, loading FA 16..80 and Mamba 80
    g = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": _D, "offload": {}})
    r = S.run_request(g, 100, max_num_batched_tokens=16, evict_gpu=lambda group, end: True,
                      evict_tier=lambda group, end: (group, end) == (1, 96))
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (0, 80)
    assert [grp["load_keys"] for grp in r.plan.to_dict()["groups"]] == [[16, 32, 48, 64, 80], [80]]
    assert r.ok



def test_run_request_tier_evictions_given_as_bools_follow_the_group_end_token_order():
    # the vLLM run above, the tier's Mamba key at 96 evicted by booleans over the tier's entries sorted by (group,
    # end token): FA 16..96, then Mamba 16..96, the last one True. vLLM: hit 80, loading FA 16..80 and Mamba 80
    g = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": _D, "offload": {}})
    r = S.run_request(g, 100, max_num_batched_tokens=16, evict_gpu=lambda group, end: True,
                      evict_tier=[False] * 11 + [True])
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (0, 80)
    assert [grp["load_keys"] for grp in r.plan.to_dict()["groups"]] == [[16, 32, 48, 64, 80], [80]]
    assert r.ok


@pytest.mark.parametrize(
    ("entry", "lost", "problems"),
    [
        # a fault past the local hit 32 (positions 40..47 of the adopted FA entry ending at 64): the request loads
        # [32, 96) from the tier and does not read them, so nothing is reported
        ((0, 64), range(40, 48), ()),
        # a fault below it (position 5 of the FA entry ending at 32) is reported
        ((0, 32), range(5, 6),
         ("group 0: resuming at 32 needs positions [0, 32); 1 are in no adopted entry (first 5)",)),
    ],
)
def test_run_request_checks_the_adopted_entries_up_to_the_local_hit_it_resumes_at(monkeypatch, entry, lost,
                                                                                   problems):
    # run_request's doctest run (vLLM: a GPU hit of 48 resumed at L = 32, 64 loaded), with an injected fault in
    # the GPU cache: an adopted entry misses some positions. The checker (run_request's docstring) checks the
    # adopted entries up to plan.local_hit_tokens, not up to the GPU hit
    real = S.GPUPrefixCache.cache_request

    def faulty(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.entries[entry] = tuple(p for p in self.entries[entry] if p not in lost)

    monkeypatch.setattr(S.GPUPrefixCache, "cache_request", faulty)
    r = S.run_request(DENSE, 100, max_num_batched_tokens=16, evict_gpu=lambda g, e: g == 1 and e > 48)
    assert (r.plan.local.hit_tokens, r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (48, 32, 64)
    assert r.local_problems == problems
    assert r.ok == (not problems)


def test_run_request_reports_a_lost_load(monkeypatch):
    # the same run as above with the simulated load dropped: the restored GPU misses what the external hit
    # claims, and the report says so
    g = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": _D, "offload": {}})
    monkeypatch.setattr(S.Simulator, "load", lambda self, plan: None)
    r = S.run_request(g, 100, max_num_batched_tokens=16, evict_gpu=lambda group, end: True,
                      evict_tier=lambda group, end: (group, end) == (1, 96))
    assert r.plan.external_hit_tokens == 80 and r.restore_problems and not r.ok


def test_run_request_checks_the_local_mamba_state_when_nothing_is_loaded(monkeypatch):
    # no offload: the local hit 96 (vLLM run, see above) adopts the Mamba entry at 96; an entry holding the state
    # after 95 tokens is reported
    g = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": _D})
    real = S.GPUPrefixCache._holds
    monkeypatch.setattr(S.GPUPrefixCache, "_holds",
                        lambda self, group, end: end - 1 if group == 1 else real(self, group, end))
    r = S.run_request(g, 100)
    assert r.plan.local_hit_tokens == 96
    assert r.local_problems == ("group 1: resuming at 96 adopts Mamba states [95], not [96]",)


_FINE64 = {"groups": [FA16 | {"block_size": 64}, {"kind": "mamba", "block_size": 64}],
           "cache": {"prefix_match_unit": 16}, "offload": {}}
_EAGLE_FA32 = {"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                          {"kind": "sliding_window", "block_size": 32, "sliding_window": 2, "drafter": True}],
               "speculative": {"method": "eagle", "num_speculative_tokens": 3, "lookahead_hashes": False},
               "cache": {"retention_interval": 64, "prefix_match_unit": 16}, "offload": {}}


@pytest.mark.parametrize(
    ("cfg", "n", "kw", "resident"),
    [
        # FA64 + Mamba64, H = 16 (vLLM runs, the block pool's cached entries after the prompt): a 24-token prompt
        # (chunks end at 16, 24) leaves both groups' partial entry at 16, the Mamba state there included ...
        (_FINE64, 24, {}, {"0": [16], "1": [16]}),
        # ... and a 40-token prompt prefilled with budgets 8, 100 (chunks end at 8, 32, 40) the entries at 32
        (_FINE64, 40, {"chunk_ends": (8, 32, 40)}, {"0": [32], "1": [32]}),
        # FA32 + SWA32, both drafters, EAGLE K3 (the drop), H = 16: an 80-token prompt keeps FA's partial entry at
        # rdown(80, 16) = 80, the whole prompt (no n - 1 cap); a 90-token prompt keeps it at 80 too
        (_EAGLE_FA32, 80, {}, {"0": [32, 64, 80], "1": [32, 64]}),
        (_EAGLE_FA32, 90, {}, {"0": [32, 64, 80], "1": [32, 64]}),
        # FA16 + Mamba16 with H = 1: a 2-token prompt leaves both groups' partial entry at its first token
        ({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": {"prefix_match_unit": 1, **_D},
          "offload": {}}, 2, {}, {"0": [1], "1": [1]}),
    ],
    ids=["fine64-24", "fine64-40-split", "eagle-fa32-80", "eagle-fa32-90", "h1-2"],
)
def test_gpu_prefix_cache_partial_entries_match_vllm(cfg, n, kw, resident):
    c = S.GPUPrefixCache(kvgeom.resolve(cfg))
    c.cache_request(n, **kw)
    assert c.resident() == resident


_DROP16 = {"groups": [FA16, {"kind": "mamba", "block_size": 16}, {**FA16, "num_kv_heads": 4, "drafter": True}],
           "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {},
           "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
_MTP16 = {"groups": [FA16, {"kind": "mamba", "block_size": 16}],
          "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {},
          "speculative": {"method": "mtp", "num_speculative_tokens": 2, "lookahead_hashes": False}}
_MTP32 = {"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 32}],
          "cache": {"prefix_match_unit": 8, "retention_interval": 32}, "offload": {},
          "speculative": {"method": "mtp", "num_speculative_tokens": 1, "lookahead_hashes": False}}
_MTP3_16 = {"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": {"prefix_match_unit": 8, **_D},
            "offload": {}, "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}}
_MTP3_64 = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
            "cache": {"prefix_match_unit": 16}, "offload": {},
            "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}}


@pytest.mark.parametrize(
    ("cfg", "n", "resident", "ends"),
    [
        # vLLM runs (the block pool's cached entries after the prompt, unbounded budget). Under the GPU drop the
        # prompt's H-grid checkpoint lies one A = 8 below rdown(n - 1, 8), and the Mamba manager keys its state
        # there: 8 for a 17-token prompt, 40 for 50; for 57 the checkpoint 48 is on the Mamba block grid and is
        # kept although the store mask (replay boundaries 16, 32) does not keep that block
        (_DROP16, 17, {"0": [16], "1": [8], "2": [16]}, None),
        (_DROP16, 50, {"0": [16, 32, 48], "1": [32, 40], "2": [16, 32, 48]}, None),
        (_DROP16, 57, {"0": [16, 32, 48, 56], "1": [32, 48], "2": [16, 32, 48, 56]}, None),
        (_MTP16, 100, {"0": [16, 32, 48, 64, 80, 96], "1": [80, 88]}, None),
        (_MTP32, 90, {"0": [32, 64, 88], "1": [32, 80]}, None),
        # multi-module MTP (P = 3): no step caches exactly the checkpoint (a step ending at e caches e - 2), so
        # no Mamba state is keyed there
        (_MTP3_16, 17, {}, None),
        (_MTP3_16, 100, {"0": [16, 32, 48, 64, 80, 96], "1": [80, 96]}, None),
        # FA64 + Mamba64, H 16, the same MTP: budgets 64, 16, 2, 100 end chunks at 64, 80, 82, 100, and the step
        # ending at 82 caches exactly the checkpoint 80: the Mamba state there is kept (vLLM's own split of 100,
        # chunks ending at 80 and 100, keeps none: the row above's default)
        (_MTP3_64, 100, {"0": [64, 96], "1": [80]}, (64, 80, 82, 100)),
        (_MTP3_64, 100, {"0": [64, 96]}, None),
    ],
    ids=["eagle-17", "eagle-50", "eagle-57", "mtp-100", "mtp32-90", "mtp3-17", "mtp3-100", "mtp3-64-split",
         "mtp3-64-unbounded"],
)
def test_gpu_prefix_cache_keys_the_mamba_state_at_the_prompt_checkpoint_as_vllm(cfg, n, resident, ends):
    c = S.GPUPrefixCache(kvgeom.resolve(cfg))
    c.cache_request(n, chunk_ends=ends)
    assert {g: e for g, e in c.resident().items() if e} == resident


def test_gpu_prefix_cache_takes_a_first_chunk_ending_at_one_token():
    # vLLM run: a 1-token prompt (FA16 + Mamba16) is one chunk ending at 1 and leaves nothing cached
    c = S.GPUPrefixCache(kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": _D}))
    c.cache_request(1, chunk_ends=[1])
    assert (c.chunk_ends, c.resident()) == (frozenset({1}), {"0": [], "1": []})


def test_run_request_loads_nothing_when_the_connector_finds_nothing_past_a_partial_local_hit():
    # FA32 + Mamba32, H = 16, dense retention, an 83-token prompt, then the tier emptied: vLLM run (its GPU entries
    # FA 32, 64, 80 and Mamba 64, 80 admitted by vLLM's Scheduler for 155 tokens): local hit 80, the connector
    # asked from the L-aligned 64 answers 0, nothing external. No load is followed, so no restore problem.
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 32}],
                        "cache": {"prefix_match_unit": 16, "retention_interval": None}, "offload": {}})
    r = S.run_request(g, 155, first_tokens=83, evict_tier=lambda group, end: True)
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens) == (80, 0)
    assert (r.local_problems, r.tier_problems, r.restore_problems) == ((), (), ())
