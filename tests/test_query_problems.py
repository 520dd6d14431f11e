"""Example table: the problem each rule-module query reports for a bad argument.

The ``field`` of a :class:`kvgeom.Problem` names the argument to fix and its ``values`` hold the numbers
(docs/errors in ``kvgeom/errors.py``); scripts match on both, so a query that blames the wrong argument or
drops a number is a bug even when it raises the right class. Found by mutation testing (docs/mutation.md):
these rows kill the mutants that rename a field or drop a number.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom import boundaries, keys, masks, ranks
from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention 16 (DCP 2: span 32) + align Mamba 16, k = 1, H = 16
SEED_K4 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
NO_OFFLOAD = kvgeom.resolve({k: v for k, v in kvgeom.DEFAULT_CONFIG.items() if k != "offload"})
BIG = 1 << 62  # a chunk index whose key would not fit an int64
# DCP 2^17 x TP 2^17: 2^17 KV shards, more than rank_lengths lists
WIDE = kvgeom.resolve(
    {"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 1 << 17, "dcp": 1 << 17}}
)

# (call, code, field, values the problem must hold)
ROWS = [
    # boundaries: each argument is named by its own name
    (lambda: boundaries.restore_read_block(SEED, 1, 0), "zero", "num_computed_tokens", {"num_computed_tokens": 0}),
    (lambda: boundaries.running_state_block(SEED, 1, -1, 1), "negative", "num_computed_tokens", {}),
    (lambda: boundaries.running_state_block(SEED, 1, 1, -2), "negative", "num_scheduled_tokens", {}),
    # a step of 0 + 0 tokens blames the scheduled count (the computed count may well be 0)
    (lambda: boundaries.running_state_block(SEED, 1, 0, 0), "zero", "num_scheduled_tokens", {}),
    # each count fits, their sum does not
    (
        lambda: boundaries.running_state_block(SEED, 1, INT64_MAX, 1),
        "int64_overflow",
        "computed + scheduled tokens",
        {"computed + scheduled tokens": INT64_MAX + 1},
    ),
    (lambda: boundaries.is_restorable(SEED, 1, -3), "negative", "num_tokens", {"num_tokens": -3}),
    (lambda: boundaries.max_restorable_tokens(SEED, 1, -3), "negative", "num_tokens", {"num_tokens": -3}),
    (lambda: boundaries.state_block_for_boundary(SEED, 0, 16), "not_align_mamba", "group", {"group": 0}),
    # keys: the chunk argument, then the key it would give
    (lambda: keys.chunk_hash_index(SEED, 0, -1), "negative", "chunk", {"chunk": -1}),
    # attention chunk = 2 hashes: (2^62 + 1) * 2 - 1 overflows
    (lambda: keys.chunk_hash_index(SEED, 0, BIG), "int64_overflow", "hash_index", {"hash_index": (BIG + 1) * 2 - 1}),
    (lambda: keys.chunk_end_token(SEED, 0, -1), "negative", "chunk", {"chunk": -1}),
    # attention chunk = 32 tokens
    (lambda: keys.chunk_end_token(SEED, 0, BIG), "int64_overflow", "end_token", {"end_token": (BIG + 1) * 32}),
    (lambda: keys.chunk_block_entries(SEED_K4, 0, -1), "negative", "chunk", {"chunk": -1}),
    # k = 4: the last entry (2^62 + 1) * 4 - 1 overflows
    (
        lambda: keys.chunk_block_entries(SEED_K4, 0, BIG),
        "int64_overflow",
        "block entry",
        {"block entry": (BIG + 1) * 4 - 1},
    ),
    (lambda: keys.chunk_of_entry(SEED, 0, -5), "negative", "entry", {"entry": -5}),
    (lambda: keys.chunk_for_end_token(SEED, 0, 0), "zero", "end_token", {"end_token": 0}),
    (lambda: keys.boundary_hash_index(SEED, 0), "zero", "end_token", {"end_token": 0}),
    # 40 is off the H = 16 grid: the problem holds both numbers
    (
        lambda: keys.boundary_hash_index(SEED, 40),
        "not_on_hash_grid",
        "end_token",
        {"end_token": 40, "hash_block_size": 16},
    ),
    (lambda: keys.positional_blocks_per_chunk(SEED, 1), "not_positional", "group", {"group": 1}),
    (lambda: keys.key_map(SEED, -1), "negative", "prefix_tokens", {"prefix_tokens": -1}),
    # no offload section: no keys at all
    (lambda: keys.key_map(NO_OFFLOAD, 64), "no_offload", "offload", {}),
    # 2^30 tokens: 2^25 attention keys alone, past the 2^20 entries one scalar key map builds
    (
        lambda: keys.key_map(SEED, 1 << 30),
        "result_too_large",
        "prefix_tokens",
        {"prefix_tokens": 1 << 30, "limit": 1 << 20},
    ),
    # ranks
    (lambda: ranks.rank_lengths(WIDE, 0, 5), "result_too_large", "num_tokens", {"shards": 1 << 17, "limit": 1 << 16}),
    # a block-table row is a list or a 1-D array of block ids: not a string, a 2-D array or an int
    (lambda: ranks.dcp_slot(SEED, 0, 0, "ab"), "bad_block_row", "block_row", {}),
    (lambda: ranks.dcp_slot(SEED, 0, 0, np.zeros((2, 2), dtype=np.int64)), "bad_block_row", "block_row", {}),
    (lambda: ranks.dcp_slot(SEED, 0, 0, 5), "bad_block_row", "block_row", {}),
    (lambda: ranks.slot_mapped_group(SEED, 1), "no_slot_mapping", "group", {"group": 1}),
    (lambda: ranks.rank_lengths(SEED, 0, -7), "negative", "num_tokens", {"num_tokens": -7}),
    # position 100 of a span-32 group is column 3; a 2-entry row is too short
    (lambda: ranks.dcp_slot(SEED, 0, 100, [5, 6]), "row_too_short", "block_row", {"column": 3, "row_length": 2}),
    (lambda: ranks.dcp_slot(SEED, 0, 0, [-1]), "negative", "block_row entry", {"block_row entry": -1}),
    # block id 2^62 times the per-rank block 16 overflows; position 0 is offset 0 on rank 0
    (lambda: ranks.dcp_slot(SEED, 0, 0, [BIG]), "int64_overflow", "slot", {"slot": BIG * 16}),
    # masks: each keyword is named by its own name
    (lambda: masks.reachable_block_mask(SEED, 1, -1), "negative", "num_blocks", {"num_blocks": -1}),
    (lambda: masks.reachable_block_mask(SEED, 1, 4, first_block=-1), "negative", "first_block", {}),
    (lambda: masks.reachable_block_mask(SEED, 1, 4, reachable=[-16]), "negative", "reachable boundary", {}),
    (lambda: masks.reachable_block_mask(SEED, 1, 4, retention=-32), "negative", "retention", {"retention": -32}),
    (
        lambda: masks.reachable_block_mask(SEED, 1, 4, retention=None, final_segment_end_block=-1),
        "negative",
        "final_segment_end_block",
        {},
    ),
    (lambda: masks.reachable_block_mask(SEED, 1, 4, alignment=-16), "negative", "alignment", {"alignment": -16}),
    # swa_store_horizon: each keyword is named by its own name
    (
        lambda: masks.swa_store_horizon(SEED, 0, storable_chunks=-1, prompt_chunks=0, finished=False),
        "negative",
        "storable_chunks",
        {"storable_chunks": -1},
    ),
    (
        lambda: masks.swa_store_horizon(SEED, 0, storable_chunks=0, prompt_chunks=-2, finished=False),
        "negative",
        "prompt_chunks",
        {"prompt_chunks": -2},
    ),
    (
        lambda: masks.swa_store_horizon(SEED, 0, storable_chunks=0, prompt_chunks=0, finished="false"),
        "not_a_bool",
        "finished",
        {},
    ),
    # Mamba 16 with R = 32 keeps every 2nd block from block 1: (2^26 - 1) // 2 blocks, past 2^24
    (
        lambda: masks.reachable_block_mask(SEED, 1, 1 << 26, retention=32, alignment=32),
        "result_too_large",
        "num_blocks",
        {"count": ((1 << 26) - 1) // 2},
    ),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), ROWS)
def test_query_problem_names_the_argument_and_numbers(call, code, field, values):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values
    assert isinstance(problem.message, str) and problem.message


def test_scalar_result_bound_is_inclusive():
    # MAX_SCALAR_RESULT blocks are still built; one more is refused
    masks.check_result_size(masks.MAX_SCALAR_RESULT)
    with pytest.raises(QueryError) as info:
        masks.check_result_size(masks.MAX_SCALAR_RESULT + 1)
    assert info.value.problems[0].values == {"count": masks.MAX_SCALAR_RESULT + 1}


def test_key_map_limit_is_inclusive():
    # one attention group, k = 3: each key lists itself and 3 block entries. 2^18 complete chunks (plus one
    # hash unit of a partial chunk) make exactly 2^20 = MAX_KEY_MAP_ENTRIES values: built, not refused
    geom = kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {"blocks_per_chunk": 3}}
    )
    assert keys.MAX_KEY_MAP_ENTRIES == 1 << 20
    built = keys.key_map(geom, 48 * (1 << 18) + 16)
    assert len(built["groups"][0]["keys"]) == 1 << 18
    with pytest.raises(QueryError) as info:
        keys.key_map(geom, 48 * ((1 << 18) + 1))
    assert info.value.problems[0].code == "result_too_large"


def test_chunk_for_end_token_is_an_int():
    # the chunk is an index: 64 tokens of 32-token attention chunks is chunk 1, an int (not 1.0)
    chunk = keys.chunk_for_end_token(SEED, 0, 64)
    assert type(chunk) is int and chunk == 1
