"""Example tables for offload keys (docs/keys-and-boundaries.md); Mamba state boundaries are in
``test_boundaries.py``."""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom import boundaries, keys
from kvgeom.errors import QueryError

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention 16 + Mamba 16, DCP 2, k = 1
SEED_K4 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})


# (geometry, group, chunk, hash_index, end_token)
KEY_TABLE = [
    # #49964: attention chunk 0 -> h1, chunk 1 -> h3
    (SEED, 0, 0, 1, 32),
    (SEED, 0, 1, 3, 64),
    # example 1: Mamba chunks 0..3 -> h0..h3 ending at 16/32/48/64
    (SEED, 1, 0, 0, 16),
    (SEED, 1, 3, 3, 64),
    # k = 4: attention chunk 128 tokens = 8 hashes; chunk 1 -> h15 ending at 256
    (SEED_K4, 0, 1, 15, 256),
    # k = 4: Mamba chunk 64 tokens = 4 hashes; chunk 0 -> h3 ending at 64
    (SEED_K4, 1, 0, 3, 64),
]


@pytest.mark.parametrize(("geom", "group", "chunk", "hash_index", "end"), KEY_TABLE)
def test_chunk_keys(geom, group, chunk, hash_index, end):
    assert keys.chunk_hash_index(geom, group, chunk) == hash_index
    assert keys.chunk_end_token(geom, group, chunk) == end
    # the key fingerprints exactly [0, end): hash i covers [0, (i+1)*H)
    assert (hash_index + 1) * geom.hash_block_size == end
    assert keys.chunk_for_end_token(geom, group, end) == chunk
    assert keys.boundary_hash_index(geom, end) == hash_index


def test_attention_chunk_entries():
    # example 1: attention chunk j <-> block-table entry j (k = 1)
    assert [list(keys.chunk_block_entries(SEED, 0, j)) for j in range(2)] == [[0], [1]]
    # k = 4: chunk 1 <-> entries [4, 8), and the inverse map
    assert list(keys.chunk_block_entries(SEED_K4, 0, 1)) == [4, 5, 6, 7]
    assert [keys.chunk_of_entry(SEED_K4, 0, e) for e in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_mamba_key_holds_state_after_exactly_its_end_token():
    # #49964: Mamba key ending at b holds state block b/16 - 1
    got = [keys.chunk_state_block(SEED, 1, j) for j in range(4)]
    assert got == [0, 1, 2, 3]
    # what the buggy rule gave (Mamba span scaled to 32, positional store of that era: chunk j took
    # Mamba entry j): the key ending at 64 (h3) held entry 1 = the state after 32 tokens.
    buggy_span = 16 * 2
    buggy_entry_for_key_64 = 64 // buggy_span - 1
    assert (buggy_entry_for_key_64 + 1) * 16 == 32  # an earlier boundary: silent corruption
    assert (keys.chunk_state_block(SEED, 1, 3) + 1) * 16 == 64


def test_mamba_key_with_k_gt_1_takes_the_last_block_of_the_chunk():
    # k = 4: key ending at 64 holds the state after 64 tokens = block 3 (sub-slot k - 1 of the chunk)
    assert keys.chunk_state_block(SEED_K4, 1, 0) == 3
    assert keys.chunk_state_block(SEED_K4, 1, 1) == 7


def test_num_keys_counts_complete_chunks():
    # vLLM 0.33 _lookup_complete_chunks: (n // H) // hashes_per_chunk
    assert [keys.num_keys(SEED, 0, n) for n in (0, 31, 32, 63, 64, 70)] == [0, 0, 1, 1, 2, 2]
    assert [keys.num_keys(SEED, 1, n) for n in (15, 16, 70)] == [0, 1, 4]


def test_key_map_contract():
    km = SEED.key_map(64)
    assert km["prefix_tokens"] == 64
    attn, mamba = km["groups"]
    assert attn == {
        "index": 0,
        "kind": "full_attention",
        "keys": [
            {"chunk": 0, "hash_index": 1, "end_token": 32, "block_entries": [0]},
            {"chunk": 1, "hash_index": 3, "end_token": 64, "block_entries": [1]},
        ],
        "rank_lengths": [32, 32],
    }
    assert [k["state_block"] for k in mamba["keys"]] == [0, 1, 2, 3]
    assert "rank_lengths" not in mamba and all("block_entries" not in k for k in mamba["keys"])


def test_key_errors():
    no_offload = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]})
    with pytest.raises(QueryError) as info:
        keys.chunk_end_token(no_offload, 0, 0)
    assert info.value.code == "no_offload"
    with pytest.raises(QueryError) as info:
        keys.chunk_block_entries(SEED, 1, 0)
    assert info.value.code == "not_positional"
    with pytest.raises(QueryError) as info:
        keys.chunk_end_token(SEED, 0, -1)
    assert info.value.code == "negative"
    with pytest.raises(QueryError) as info:
        keys.chunk_end_token(SEED, 5, 0)
    assert info.value.code == "no_such_group"
    with pytest.raises(QueryError) as info:
        keys.boundary_hash_index(SEED, 40)
    assert info.value.code == "not_on_hash_grid"
    with pytest.raises(QueryError) as info:
        keys.num_keys(SEED, 0, 2**63)
    assert info.value.code == "int64_overflow"
    with pytest.raises(QueryError):
        keys.chunk_end_token(SEED, 0, 1.5)


def test_answers_past_int64_are_refused():
    # the batch paths compute in int64; the scalar path refuses the same inputs instead of returning bigger ints
    from kvgeom import ranks

    with pytest.raises(QueryError) as info:
        keys.chunk_end_token(SEED, 0, 2**62)
    assert info.value.code == "int64_overflow"
    with pytest.raises(QueryError) as info:
        ranks.dcp_slot(SEED, 0, 0, [2**62])
    assert info.value.code == "int64_overflow"
    with pytest.raises(QueryError) as info:
        boundaries.running_state_block(SEED, 1, 2**62, 2**62)
    assert info.value.code == "int64_overflow"
