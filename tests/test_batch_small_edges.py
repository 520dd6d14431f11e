"""Edge rows for the small rule modules and their batch twins (issue 19, mutation testing).

Each row pins one rule: the argument a problem names and the numbers it holds, an inclusive size bound,
or a batch twin's answer, which must be the scalar rule's answer on the same input (the scalar is the
oracle; for the batch twins of :mod:`kvgeom.boundaries`, :mod:`kvgeom.keys`, :mod:`kvgeom.ranks` and
:mod:`kvgeom.masks`). They were found by mutation testing (docs/mutation.md, "Result for the batch twins
..."): the example tables and laws passed with the rule broken in the way each row's comment says.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom import batch, hits, keys, ranks
from kvgeom._math import INT64_MAX
from kvgeom.batch import _arrays
from kvgeom.boundaries import state_block_for_boundary
from kvgeom.errors import QueryError

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention 16 (DCP 2: span 32) + align Mamba 16, k = 1, H = 16
# DCP 2 with cp_interleave 2: span 32, ranks take turns every 2 positions
INTERLEAVED = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 2}})
# group 1 is not prefix-cacheable, so it has no offload keys
UNCACHED = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "full_attention", "block_size": 16, "prefix_cacheable": False},
        ],
        "offload": {},
    }
)
SEED_K4 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
SEED_OFF = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})
NO_OFFLOAD = kvgeom.resolve({k: v for k, v in kvgeom.DEFAULT_CONFIG.items() if k != "offload"})
BIG = 1 << 62  # a chunk index whose key would not fit an int64
# 2^16 KV shards (the most rank_lengths lists), 15 dealt attention groups (span and chunk 2^20 tokens) and one
# align Mamba group (chunk 16): below 2^20 tokens the key map holds 15 * 2^16 rank lengths plus n // 16 Mamba keys
SHARDS = 1 << 16
WIDE = kvgeom.resolve(
    {
        "groups": [{"kind": "full_attention", "block_size": 16}] * 15
        + [{"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}],
        "parallel": {"tp": SHARDS, "dcp": SHARDS},
        "offload": {},
    }
)

# (call, code, field, values the problem must hold): scalar queries whose problem named the wrong argument
# or dropped a number under a mutant
SCALAR_PROBLEMS = [
    # a boundary is named "boundary", whether it is 0 or off the Mamba block grid
    (lambda: state_block_for_boundary(SEED, 1, 0), "zero", "boundary", {"boundary": 0}),
    (lambda: state_block_for_boundary(SEED, 1, -16), "negative", "boundary", {"boundary": -16}),
    (
        lambda: state_block_for_boundary(SEED, 1, 40),
        "not_a_state_boundary",
        "boundary",
        {"boundary": 40, "block_size": 16},
    ),
    # a group index out of range is checked as the index given (not as some other index)
    (lambda: keys.offload_group(SEED, 5), "no_such_group", "group", {"index": 5}),
    # a group that exists but is not offloaded: the problem names that group
    (lambda: keys.offload_group(UNCACHED, 1), "group_not_offloaded", "group", {"group": 1}),
    (lambda: keys.num_keys(UNCACHED, 1, 64), "group_not_offloaded", "group", {"group": 1}),
    (lambda: keys.num_keys(SEED, 0, -1), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: ranks.dcp_placement(SEED, 0, -1), "negative", "position", {"position": -1}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), SCALAR_PROBLEMS)
def test_scalar_problem_names_the_argument_and_numbers(call, code, field, values):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values
    assert isinstance(problem.message, str) and problem.message


def test_wide_key_map_counts_rank_lengths_and_one_value_per_mamba_key():
    # 2^20 - 16 tokens: no attention key yet (its chunk is 2^20 tokens), so 15 * 2^16 rank lengths and
    # 2^16 - 1 Mamba keys of one value each: 2^20 - 1 values, built (a Mamba key counted as 2 values, or as
    # 1 + k, would refuse it)
    built = keys.key_map(WIDE, (1 << 20) - 16)
    groups = built["groups"]
    assert [len(g["keys"]) for g in groups] == [0] * 15 + [SHARDS - 1]
    assert all(len(g["rank_lengths"]) == SHARDS for g in groups[:15])
    assert groups[15]["keys"][-1] == {
        "chunk": SHARDS - 2,
        "hash_index": SHARDS - 2,
        "end_token": (1 << 20) - 16,
        "state_block": SHARDS - 2,
    }
    # 2^20 tokens: one key (2 values) per attention group plus its 2^16 rank lengths, and 2^16 Mamba keys:
    # 15 * (2 + 2^16) + 2^16 = 2^20 + 30 values, refused (counting rank lengths as minus, or not at all, builds it)
    with pytest.raises(QueryError) as info:
        keys.key_map(WIDE, 1 << 20)
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == ("result_too_large", "prefix_tokens")
    assert problem.values == {"prefix_tokens": 1 << 20, "limit": keys.MAX_KEY_MAP_ENTRIES}


def test_wide_rank_lengths_bound_is_inclusive():
    # exactly MAX_RANKS_LISTED shards are still listed: 5 tokens go to ranks 0..4, one each
    assert ranks.MAX_RANKS_LISTED == SHARDS
    lengths = ranks.rank_lengths(WIDE, 0, 5)
    assert len(lengths) == SHARDS
    assert lengths[:6] == (1, 1, 1, 1, 1, 0) and sum(lengths) == 5


def test_state_block_is_an_exact_int_at_int64_scale():
    # the last Mamba boundary below 2^63 (B_m = 16): block 2^59 - 2, an int (a float quotient would round
    # 2^59 - 1 up to 2^59 and give 2^59 - 1)
    block = state_block_for_boundary(SEED, 1, (1 << 63) - 16)
    assert type(block) is int and block == (1 << 59) - 2
    assert type(state_block_for_boundary(SEED, 1, 48)) is int


@pytest.mark.parametrize(
    ("position", "column", "rank", "offset"),
    [
        # interleave 2 over 2 ranks: positions 0-1 rank 0, 2-3 rank 1, 4-5 rank 0 (offsets 2, 3), ...
        (1, 0, 0, 1),
        (2, 0, 1, 0),
        (5, 0, 0, 3),
        (7, 0, 1, 3),
        # position 37 is column 1, offset 5 in the span: round 1 of 4 positions, rank 0, offset 1*2 + 1
        (37, 1, 0, 3),
    ],
)
def test_interleaved_placement_offset_is_round_times_interleave_plus_within(position, column, rank, offset):
    placement = ranks.dcp_placement(INTERLEAVED, 0, position)
    assert placement == (column, rank, offset)
    assert type(placement.offset) is int


def _slots(**over):
    """batch.slot_mapping on SEED's attention group (B = 16, D = 2: span 32) with one 2-entry row."""
    args = {"positions": [5], "block_table": np.array([[1, 2]]), "request_index": [0], **over}
    return batch.slot_mapping(SEED, 0, args.pop("positions"), args.pop("block_table"), args.pop("request_index"),
                              **args)


# (call, code, field, values): every batch twin names the argument the scalar names and holds the same numbers;
# where several elements are bad, the first bad element's numbers
BATCH_PROBLEMS = [
    # batch.boundaries
    (
        lambda: batch.state_block_for_boundary(SEED, 1, [16, 40, 72]),
        "not_a_state_boundary",
        "boundary",
        {"boundary": 40, "block_size": 16},
    ),
    (lambda: batch.state_block_for_boundary(SEED, 1, [16, 0]), "zero", "boundary", {"boundary": 0}),
    (lambda: batch.state_block_for_boundary(SEED, 1, [16, -16]), "negative", "boundary", {"boundary": -16}),
    (
        lambda: batch.restore_read_block(SEED, 1, [5, 0]),
        "zero",
        "num_computed_tokens",
        {"num_computed_tokens": 0},
    ),
    (
        lambda: batch.running_state_block(SEED, 1, [-1], [1]),
        "negative",
        "num_computed_tokens",
        {"num_computed_tokens": -1},
    ),
    (
        lambda: batch.running_state_block(SEED, 1, [1], [-2]),
        "negative",
        "num_scheduled_tokens",
        {"num_scheduled_tokens": -2},
    ),
    (
        lambda: batch.running_state_block(SEED, 1, [1, 2], [1]),
        "length_mismatch",
        "num_scheduled_tokens",
        {"length": 1, "expected": 2},
    ),
    # the first step whose total passes int64 (the second step's total is exactly INT64_MAX: it fits)
    (
        lambda: batch.running_state_block(SEED, 1, [5, INT64_MAX - 1, INT64_MAX, 9], [1, 1, 2, INT64_MAX]),
        "int64_overflow",
        "num_computed_tokens + num_scheduled_tokens",
        {"num_computed_tokens + num_scheduled_tokens": INT64_MAX + 2},
    ),
    (lambda: batch.running_state_block(SEED, 1, [3, 0], [1, 0]), "zero", "num_scheduled_tokens", {}),
    (lambda: batch.is_restorable(SEED, 1, [4, -3]), "negative", "num_tokens", {"num_tokens": -3}),
    (lambda: batch.max_restorable_tokens(SEED, 1, [4, -3]), "negative", "num_tokens", {"num_tokens": -3}),
    (lambda: batch.is_restorable(SEED, 0, [16]), "not_align_mamba", "group", {"group": 0}),
    (lambda: batch.max_restorable_tokens(SEED, 0, [16]), "not_align_mamba", "group", {"group": 0}),
    # batch.keys
    (lambda: batch.chunk_hash_index(SEED, 0, [0, -1]), "negative", "chunk", {"chunk": -1}),
    # attention chunk = 2 hashes: (2^62 + 1) * 2 - 1 passes int64
    (
        lambda: batch.chunk_hash_index(SEED, 0, [0, BIG]),
        "int64_overflow",
        "hash_index",
        {"hash_index": (BIG + 1) * 2 - 1},
    ),
    (lambda: batch.chunk_end_token(SEED, 0, [0, -1]), "negative", "chunk", {"chunk": -1}),
    (lambda: batch.chunk_end_token(SEED, 0, [BIG]), "int64_overflow", "end_token", {"end_token": (BIG + 1) * 32}),
    (lambda: batch.chunk_first_entry(SEED_K4, 0, [-1]), "negative", "chunk", {"chunk": -1}),
    (
        lambda: batch.chunk_first_entry(SEED_K4, 0, [BIG]),
        "int64_overflow",
        "block entry",
        {"block entry": (BIG + 1) * 4 - 1},
    ),
    (lambda: batch.chunk_of_entry(SEED, 0, [3, -5]), "negative", "entry", {"entry": -5}),
    (lambda: batch.chunk_of_entry(SEED, 1, [3]), "not_positional", "group", {"group": 1}),
    (lambda: batch.chunk_for_end_token(SEED, 0, [32, 0]), "zero", "end_token", {"end_token": 0}),
    (lambda: batch.chunk_for_end_token(UNCACHED, 1, [32]), "group_not_offloaded", "group", {"group": 1}),
    (lambda: batch.boundary_hash_index(SEED, [16, 0]), "zero", "end_token", {"end_token": 0}),
    (
        lambda: batch.boundary_hash_index(SEED, [16, 40, 56]),
        "not_on_hash_grid",
        "end_token",
        {"end_token": 40, "hash_block_size": 16},
    ),
    (lambda: batch.num_keys(SEED, 0, [-1]), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: batch.num_keys(NO_OFFLOAD, 0, [64]), "no_offload", "offload", {}),
    (lambda: batch.key_maps(SEED, [-1]), "negative", "prefix_tokens", {"prefix_tokens": -1}),
    (lambda: batch.key_maps(NO_OFFLOAD, [64]), "no_offload", "offload", {}),
    # 32 * (2^26 + 1) tokens: 2^26 + 1 attention keys (C = 32), one more than a CSR result holds
    (
        lambda: batch.key_maps(SEED, [32 * (_arrays.MAX_RESULT + 1)]),
        "result_too_large",
        "key_maps",
        {"total": _arrays.MAX_RESULT + 1},
    ),
    # batch.ranks
    (lambda: batch.placements(SEED, 0, [3, -1]), "negative", "positions", {"positions": -1}),
    (lambda: batch.rank_lengths(SEED, 0, [3, -7]), "negative", "num_tokens", {"num_tokens": -7}),
    # 1025 prefixes over 2^16 shards: 2^26 + 2^16 lengths
    (
        lambda: batch.rank_lengths(WIDE, 0, np.zeros(1025, dtype=np.int64)),
        "result_too_large",
        "rank_lengths",
        {"total": 1025 * SHARDS},
    ),
    (lambda: _slots(rank=2), "no_such_rank", "rank", {"rank": 2}),
    (lambda: _slots(rank=-1), "no_such_rank", "rank", {"rank": -1}),
    (lambda: _slots(rank=True), "no_such_rank", "rank", {"rank": True}),
    (lambda: _slots(request_index=[1]), "no_such_request", "request_index", {"request_index": 1, "rows": 1}),
    # position 64 of a span-32 group is column 2; the row has 2 entries
    (lambda: _slots(positions=[64]), "row_too_short", "block_row", {"column": 2, "row_length": 2}),
    (lambda: _slots(block_table=np.array([[-3]])), "negative", "block_row entry", {"value": -3}),
    # position 5 is rank 1's offset 2: slot = id * 16 + 2
    (
        lambda: _slots(block_table=np.array([[INT64_MAX // 8]])),
        "int64_overflow",
        "slot",
        {"slot": INT64_MAX // 8 * 16 + 2},
    ),
    (lambda: _slots(request_index=[0, 0]), "length_mismatch", "request_index", {}),
    (lambda: _slots(out=np.empty(2, dtype=np.int64)), "bad_out", "out", {}),
    (lambda: _slots(block_table=np.array([[2**70]], dtype=object)), "int64_overflow", "block_table", {}),
    # _arrays: the input checks every twin shares
    (lambda: batch.num_keys(SEED, 0, [[1], [1, 2]]), "bad_shape", "num_tokens", {}),
    (lambda: batch.num_keys(SEED, 0, [[1]]), "bad_shape", "num_tokens", {"shape": (1, 1)}),
    (lambda: batch.num_keys(SEED, 0, [2**70, None]), "not_an_integer_array", "num_tokens", {}),
    (lambda: batch.num_keys(SEED, 0, [1, 2**70]), "int64_overflow", "num_tokens", {"num_tokens": 2**70}),
    (lambda: batch.num_keys(SEED, 0, [-(2**70), 1]), "negative", "num_tokens", {"num_tokens": -(2**70)}),
    (lambda: batch.num_keys(SEED, 0, [1.5]), "not_an_integer_array", "num_tokens", {"dtype": "float64"}),
    (
        lambda: batch.num_keys(SEED, 0, np.array([3, 1 << 63], dtype=np.uint64)),
        "int64_overflow",
        "num_tokens",
        {"num_tokens": 1 << 63},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, num_prompt_tokens=[10, 40]),
        "prompt_longer_than_request",
        "num_prompt_tokens",
        {"num_prompt_tokens": 40, "num_tokens": 32},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, num_prompt_tokens=[10]),
        "length_mismatch",
        "num_prompt_tokens",
        {"length": 1, "expected": 2},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, local_computed_tokens=[10, 40]),
        "local_past_request",
        "local_computed_tokens",
        {"local_computed_tokens": 40, "num_tokens": 32},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, local_computed_tokens=-1),
        "negative",
        "local_computed_tokens",
        {"local_computed_tokens": -1},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, max_load_tokens=[1, 2, 3]),
        "length_mismatch",
        "max_load_tokens",
        {"length": 3, "expected": 2},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, max_num_new_tokens=-4),
        "negative",
        "max_num_new_tokens",
        {"max_num_new_tokens": -4},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, max_load_tokens=INT64_MAX + 1),
        "int64_overflow",
        "max_load_tokens",
        {"max_load_tokens": INT64_MAX + 1},
    ),
    (
        lambda: batch.plan_stores(SEED, num_tokens=[64, 32], num_computed_tokens=[64, 32], finished=[True]),
        "length_mismatch",
        "finished",
        {"length": 1, "expected": 2},
    ),
    (
        lambda: batch.plan_stores(SEED, num_tokens=[64], num_computed_tokens=[64], finished=[1]),
        "bad_shape",
        "finished",
        {},
    ),
    (
        lambda: batch.plan_stores(SEED, num_tokens=[64], num_computed_tokens=[64], reachable=[[-2]]),
        "negative",
        "reachable",
        {"reachable": -2},
    ),
    # a range of 2^26 + 1 counts is refused by its length, before numpy builds it
    (
        lambda: batch.num_keys(SEED, 0, range(_arrays.MAX_RESULT + 1)),
        "result_too_large",
        "num_tokens",
        {"total": _arrays.MAX_RESULT + 1},
    ),
    (
        lambda: batch.num_keys(SEED, 0, range(1 << 70)),
        "result_too_large",
        "num_tokens",
        {"total": _arrays.MAX_RESULT + 1},
    ),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), BATCH_PROBLEMS)
def test_batch_problem_names_the_argument_and_numbers(call, code, field, values):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values
    assert isinstance(problem.message, str) and problem.message


# ---------------------------------------------------------------------------------------------
# Batch twin == scalar rule on fixed inputs: the values at and around every block, chunk and hash edge
# (the property laws draw such values only now and then)
# ---------------------------------------------------------------------------------------------

# partial tails: H = 8 below the 32-token blocks, k = 1, no DCP
TAIL = kvgeom.resolve(
    {
        "groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 32,
                                                                  "mamba_cache_mode": "align"}],
        "cache": {"prefix_match_unit": 8},
        "offload": {},
    }
)
# no power of two anywhere: B = 24, k = 3 (chunks of 72 tokens, 3 hashes of 24)
ODD = kvgeom.resolve(
    {
        "groups": [{"kind": "full_attention", "block_size": 24}, {"kind": "mamba", "block_size": 24,
                                                                  "mamba_cache_mode": "align"}],
        "offload": {"blocks_per_chunk": 3},
    }
)
# DCP 3 with cp_interleave 2: span 72, rank r holds positions 2r, 2r+1 of each 6; Mamba block 48, k = 2
DCP3 = kvgeom.resolve(
    {
        "groups": [{"kind": "full_attention", "block_size": 24}, {"kind": "mamba", "block_size": 48,
                                                                  "mamba_cache_mode": "align"}],
        "parallel": {"tp": 3, "dcp": 3, "cp_interleave": 2},
        "offload": {"blocks_per_chunk": 2},
    }
)
GEOMS = {"seed": SEED, "seed_k4": SEED_K4, "tail": TAIL, "odd": ODD, "dcp3": DCP3}
COUNTS = [0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49, 63, 64, 65, 71, 72, 73, 95, 96, 97,
          143, 144, 145, 1000, 1 << 40]


def _mamba_boundaries(geom):
    b = geom.groups[1].block_size
    return [b, 2 * b, 3 * b, 7 * b, b << 30]


# (batch twin, scalar rule, group, inputs, how a scalar answer reads in the batch result)
TWINS = [
    (batch.state_block_for_boundary, kvgeom.boundaries.state_block_for_boundary, 1, _mamba_boundaries, int),
    (batch.restore_read_block, kvgeom.boundaries.restore_read_block, 1, lambda g: COUNTS[1:], int),
    (batch.is_restorable, kvgeom.boundaries.is_restorable, 1, lambda g: COUNTS, bool),
    (
        lambda g, grp, v: batch.is_restorable(g, grp, v, partial_tail=True),
        lambda g, grp, v: kvgeom.boundaries.is_restorable(g, grp, v, partial_tail=True),
        1,
        lambda g: COUNTS,
        bool,
    ),
    (batch.max_restorable_tokens, kvgeom.boundaries.max_restorable_tokens, 1, lambda g: COUNTS, int),
    (batch.chunk_hash_index, keys.chunk_hash_index, 0, lambda g: COUNTS, int),
    (batch.chunk_hash_index, keys.chunk_hash_index, 1, lambda g: COUNTS, int),
    (batch.chunk_end_token, keys.chunk_end_token, 0, lambda g: COUNTS, int),
    (batch.chunk_end_token, keys.chunk_end_token, 1, lambda g: COUNTS, int),
    (batch.chunk_first_entry, keys.chunk_block_entries, 0, lambda g: COUNTS, lambda r: r.start),
    (batch.chunk_state_block, keys.chunk_state_block, 1, lambda g: COUNTS, int),
    (batch.chunk_of_entry, keys.chunk_of_entry, 0, lambda g: COUNTS, int),
    (batch.chunk_for_end_token, keys.chunk_for_end_token, 0, lambda g: COUNTS[1:], lambda c: -1 if c is None else c),
    (batch.chunk_for_end_token, keys.chunk_for_end_token, 1, lambda g: COUNTS[1:], lambda c: -1 if c is None else c),
    (batch.num_keys, keys.num_keys, 0, lambda g: COUNTS, int),
    (batch.num_keys, keys.num_keys, 1, lambda g: COUNTS, int),
    (
        lambda g, grp, v: batch.boundary_hash_index(g, v),
        lambda g, grp, v: keys.boundary_hash_index(g, v),
        0,
        lambda g: [g.hash_block_size * m for m in (1, 2, 3, 5, 9, 1 << 30)],
        int,
    ),
    (batch.rank_lengths, lambda g, grp, v: list(ranks.rank_lengths(g, grp, v)), 0, lambda g: COUNTS, list),
    (batch.rank_lengths, lambda g, grp, v: list(ranks.rank_lengths(g, grp, v)), 1, lambda g: COUNTS, list),
]


@pytest.mark.parametrize(("batch_fn", "scalar_fn", "group", "inputs", "read"), TWINS)
def test_batch_twin_equals_the_scalar_rule_at_the_edges(batch_fn, scalar_fn, group, inputs, read):
    for name, geom in GEOMS.items():
        values = inputs(geom)
        want = [read(scalar_fn(geom, group, v)) for v in values]
        got = batch_fn(geom, group, values)
        assert got.tolist() == want, name
        assert got.dtype in (np.int64, np.bool_), name


@pytest.mark.parametrize("geom_name", list(GEOMS))
def test_running_state_block_equals_the_scalar_rule(geom_name):
    geom = GEOMS[geom_name]
    b = geom.groups[1].block_size
    computed = [0, 0, 0, b - 1, b, b, 3 * b + 1, 1 << 40]
    scheduled = [1, b, b + 1, 1, 0, 1, b - 1, 5]
    want = [kvgeom.boundaries.running_state_block(geom, 1, c, s) for c, s in zip(computed, scheduled, strict=True)]
    assert batch.running_state_block(geom, 1, computed, scheduled).tolist() == want


@pytest.mark.parametrize("geom_name", list(GEOMS))
def test_placements_equal_the_scalar_rule(geom_name):
    geom = GEOMS[geom_name]
    for group in range(len(geom.groups)):
        got = batch.placements(geom, group, COUNTS)
        want = [ranks.dcp_placement(geom, group, p) for p in COUNTS]
        assert got.column.tolist() == [w.column for w in want]
        assert got.rank.tolist() == [-1 if w.rank is None else w.rank for w in want]
        assert got.offset.tolist() == [w.offset for w in want]


@pytest.mark.parametrize("geom_name", list(GEOMS))
def test_key_maps_equal_the_scalar_key_maps(geom_name):
    geom = GEOMS[geom_name]
    prefixes = [0, 7, 8, 16, 31, 32, 33, 64, 72, 100, 144, 145, 300]
    km = batch.key_maps(geom, prefixes)
    assert len(km) == len(prefixes)
    for i, n in enumerate(prefixes):
        assert km.key_map(i) == keys.key_map(geom, n)


@pytest.mark.parametrize("rank", [None, 0, 1])
@pytest.mark.parametrize("geom_name", ["interleaved", "dcp3"])
def test_checked_slot_path_equals_dcp_slot(geom_name, rank):
    # a negative id in a column no position uses sends slot_mapping down its checked path (each gathered
    # entry checked); with interleaved dealing its slots are still dcp_slot's, and with rank=None every
    # position gets its owner's slot (no pad slot)
    geom = {"interleaved": INTERLEAVED, "dcp3": DCP3}[geom_name]
    row = [7, 9, -1]
    positions = list(range(2 * geom.groups[0].span))
    want = []
    for p in positions:
        owner, slot = ranks.dcp_slot(geom, 0, p, row)
        want.append(slot if rank is None or owner == rank else -1)
    got = batch.slot_mapping(geom, 0, positions, np.array([row]), [0] * len(positions), rank=rank)
    assert got.tolist() == want


def test_max_restorable_tokens_with_a_one_token_mamba_chunk():
    # B_m = 1, k = 1: every count is a chunk boundary; the restorable prefix is n - 1 (0 for 0 and 1)
    geom = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 1, "mamba_cache_mode": "align"}], "offload": {}})
    counts = [0, 1, 2, 3, 17]
    want = [kvgeom.boundaries.max_restorable_tokens(geom, 0, n) for n in counts]
    assert want == [0, 0, 1, 2, 16]
    assert batch.max_restorable_tokens(geom, 0, counts).tolist() == want


@pytest.mark.parametrize("value", [32.0, True, "32", np.float64(32)])
@pytest.mark.parametrize(
    ("call", "scalar", "field"),
    [
        (lambda v: batch.lookup_hits(SEED, [64], stored={}, max_num_new_tokens=v),
         lambda v: hits.lookup_hit(SEED, 64, stored={}, max_num_new_tokens=v), "max_num_new_tokens"),
        (lambda v: batch.lookup_hits(SEED, [64], stored={}, max_load_tokens=v),
         lambda v: hits.lookup_hit(SEED, 64, stored={}, max_load_tokens=v), "max_load_tokens"),
        (lambda v: batch.lookup_hits(SEED, [64], stored={}, local_computed_tokens=v),
         lambda v: hits.lookup_hit(SEED, 64, stored={}, local_computed_tokens=v), "local_computed_tokens"),
        (lambda v: batch.plan_stores(SEED_OFF, num_tokens=[64], num_computed_tokens=[64], max_offload_tokens=v),
         lambda v: hits.plan_store(SEED_OFF, num_tokens=64, num_computed_tokens=64, max_offload_tokens=v),
         "max_offload_tokens"),
    ],
)
def test_a_scalar_argument_that_is_no_integer_is_refused_by_the_batch_as_by_the_scalar(call, scalar, field, value):
    """Issue 19's fuzz: a float scalar given for a per-request count was refused as an array shape ('has shape
    ()'); it is not_an_integer naming the field, as the scalar API says."""
    with pytest.raises(kvgeom.QueryError) as ours:
        call(value)
    with pytest.raises(kvgeom.QueryError) as theirs:
        scalar(value)
    assert (ours.value.code, ours.value.problems[0].field) == (theirs.value.code, field) == ("not_an_integer", field)


def test_a_per_request_flag_of_the_wrong_length_or_shape_is_refused_naming_it():
    """kvgeom.batch's bool arguments: a list or range of another length is length_mismatch before it is built
    (a range whose len() overflows counts as more than MAX_RESULT), an array of another length too, and an array
    of ints is bad_shape, each naming the argument."""
    from kvgeom.batch._arrays import MAX_RESULT

    def refused(**kw):
        with pytest.raises(QueryError) as e:
            batch.plan_stores(SEED_OFF, num_tokens=[64, 64], num_computed_tokens=[64, 64], **kw)
        return e.value.code, e.value.problems[0].field, e.value.values, str(e.value)

    code, field, values, _ = refused(finished=range(2**64))
    assert (code, field) == ("length_mismatch", "finished") and values["length"] == MAX_RESULT + 1
    assert refused(loaded_from_offload=range(3))[:3] == ("length_mismatch", "loaded_from_offload",
                                                         {"length": 3, "expected": 2})
    assert refused(partial_tail_stored=np.array([True]))[:3] == ("length_mismatch", "partial_tail_stored",
                                                                 {"length": 1, "expected": 2})
    code, field, _, text = refused(finished=np.array([1, 0]))
    assert (code, field) == ("bad_shape", "finished") and "a bool or a 1-D bool array" in text
