"""Example tables for Mamba state boundaries (``kvgeom.boundaries``; docs/keys-and-boundaries.md).

In align mode Mamba block *i* holds the state after exactly ``(i + 1) * B_m`` tokens; a request starting with
``N`` computed tokens reads block ``(N - 1) // B_m``. Mamba is replicated, so ``B_m`` is the group's own block
size under any DCP: a state block is ``end / B_m - 1``, never ``end / (B_m * dcp) - 1`` (#49962, #49964).
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom import boundaries
from kvgeom.errors import QueryError

FA16, M16, M32 = ({"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
                  {"kind": "mamba", "block_size": 32})
SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention 16 + Mamba 16, DCP 2, k = 1
SEED_K4 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
SEED_K2 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 2}})
NO_OFFLOAD = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": None})  # the same groups, no connector
M32_DCP2 = kvgeom.resolve({"groups": [FA16, M32], "parallel": {"tp": 2, "dcp": 2}, "offload": {}})
M16_DCP4 = kvgeom.resolve({"groups": [FA16, M16], "parallel": {"tp": 4, "dcp": 4}, "offload": {}})


# (geometry, boundary, state block)
STATE_TABLE = [
    (SEED, 16, 0),  # first Mamba block holds the state after 16 tokens
    (SEED, 64, 3),  # docs/keys-and-boundaries.md: block b/B_m - 1, B_m = 16 under any DCP
]


@pytest.mark.parametrize(("geom", "boundary", "block"), STATE_TABLE)
def test_state_block_for_boundary(geom, boundary, block):
    assert boundary == (block + 1) * 16
    assert boundaries.state_block_for_boundary(geom, 1, boundary) == block


def test_restore_reads_block_n_minus_1_div_b():
    # docs/keys-and-boundaries.md: a request starting with N computed tokens reads block (N-1) // B_m
    assert [boundaries.restore_read_block(SEED, 1, n) for n in (1, 16, 17, 48, 64)] == [0, 0, 1, 2, 3]
    # running state during a step: cdiv(computed + scheduled, B_m) - 1
    assert boundaries.running_state_block(SEED, 1, 0, 16) == 0
    assert boundaries.running_state_block(SEED, 1, 16, 1) == 1


def test_restorable_boundaries():
    # multiples of the Mamba chunk only (16 here; 64 with k = 4)
    assert [boundaries.is_restorable(SEED, 1, n) for n in (0, 16, 24, 48)] == [False, True, False, True]
    assert [boundaries.is_restorable(SEED_K4, 1, n) for n in (16, 48, 64)] == [False, False, True]
    # partial tails: only where the geometry supports them (D = 1, k = 1, H < B_m)
    hybrid = [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]
    tail = kvgeom.resolve({"groups": hybrid, "cache": {"prefix_match_unit": 8}, "offload": {}})
    assert boundaries.is_restorable(tail, 1, 24, partial_tail=True)
    assert not boundaries.is_restorable(tail, 1, 24)
    assert not boundaries.is_restorable(SEED, 1, 24, partial_tail=True)


def test_resend_never_restores_at_num_tokens():
    # #44599: a prompt ending exactly on a chunk boundary restores one chunk earlier
    assert boundaries.max_restorable_tokens(SEED, 1, 64) == 48
    assert boundaries.max_restorable_tokens(SEED_K4, 1, 128) == 64
    # the buggy rule (no rounding to the Mamba chunk after the -1) gave 63 with k = 1 -- a hit whose
    # restore reads block (63-1)//16 = 3, the state after 64 tokens, which already consumed token 63.
    assert boundaries.restore_read_block(SEED, 1, 63) == 3
    assert boundaries.max_restorable_tokens(SEED, 1, 65) == 64


def test_boundary_errors():
    with pytest.raises(QueryError) as info:
        boundaries.state_block_for_boundary(SEED, 1, 24)
    assert info.value.code == "not_a_state_boundary"
    with pytest.raises(QueryError) as info:
        boundaries.state_block_for_boundary(SEED, 0, 32)
    assert info.value.code == "not_align_mamba"
    with pytest.raises(QueryError):
        boundaries.restore_read_block(SEED, 1, 0)


# ----------------------------------------------------------------------------------- under DCP (#49962, #49964)

# (geometry, boundary, state block end / B_m - 1, what the DCP-scaled rule end / (B_m * dcp) - 1 gave)
DCP_STATE_TABLE = [
    (SEED, 32, 1, 0),  # Mamba 16 under DCP 2: the state after 32 tokens is block 1, not block 0
    (SEED, 64, 3, 1),  # #49964's key ending at 64: block 3 (the scaled rule read block 1, the state after 32)
    (M32_DCP2, 64, 1, 0),  # Mamba 32 under DCP 2: 64 / 32 - 1 = 1, never 64 / 64 - 1 = 0
    (M32_DCP2, 96, 2, 0),  # 96 / 32 - 1 = 2; the scaled rule: 96 // 64 - 1 = 0
    (M16_DCP4, 64, 3, 0),  # Mamba 16 under DCP 4: 64 / 16 - 1 = 3, never 64 / 64 - 1 = 0
]


@pytest.mark.parametrize(("geom", "boundary", "block", "scaled"), DCP_STATE_TABLE)
def test_state_block_is_end_over_mamba_block_under_any_dcp(geom, boundary, block, scaled):
    assert boundaries.state_block_for_boundary(geom, 1, boundary) == block != scaled
    assert geom.config.parallel.dcp > 1 and boundary // (geom.groups[1].block_size * geom.config.parallel.dcp) - 1 \
        == scaled


@pytest.mark.parametrize(
    ("geom", "chunk"),
    [
        (SEED, 16),  # offload k = 1: B_m * k = 16, not the DCP-scaled attention chunk 32
        (SEED_K2, 32),  # k = 2: 16 * 2 (the connector's mamba_align_size)
        (SEED_K4, 64),  # k = 4: 16 * 4
        (NO_OFFLOAD, 16),  # no connector: the group's span B_m = 16
        (M32_DCP2, 32),  # Mamba 32 under DCP 2: 32, not 64
        (M16_DCP4, 16),  # Mamba 16 under DCP 4: 16, not 64
    ],
)
def test_mamba_chunk_tokens(geom, chunk):
    assert boundaries.mamba_chunk_tokens(geom, 1) == chunk


# (geometry, num_computed_tokens, block read) -- (N - 1) // B_m
READ_TABLE = [
    (M32_DCP2, 32, 0),  # the state after 32 tokens: block 0
    (M32_DCP2, 33, 1),  # one token past it: the block that will hold the state after 64
    (M32_DCP2, 64, 1),  # (64 - 1) // 32 = 1, not (64 - 1) // 64 = 0
    (M32_DCP2, 65, 2),  # (65 - 1) // 32 = 2
    (M16_DCP4, 64, 3),  # (64 - 1) // 16 = 3 under DCP 4
]


@pytest.mark.parametrize(("geom", "n", "block"), READ_TABLE)
def test_restore_read_block_under_dcp(geom, n, block):
    assert boundaries.restore_read_block(geom, 1, n) == block


@pytest.mark.parametrize(
    ("geom", "computed", "scheduled", "block"),
    [
        (SEED, 32, 5, 2),  # cdiv(37, 16) - 1 = 2
        (M32_DCP2, 0, 33, 1),  # cdiv(33, 32) - 1 = 1: the step's state lives in the second block
        (M32_DCP2, 32, 5, 1),  # cdiv(37, 32) - 1 = 1
        (M32_DCP2, 0, 32, 0),  # exactly one block: block 0
    ],
)
def test_running_state_block_rows(geom, computed, scheduled, block):
    assert boundaries.running_state_block(geom, 1, computed, scheduled) == block


@pytest.mark.parametrize(
    ("geom", "n", "restorable", "max_hit"),
    [
        (SEED, 0, False, 0),  # nothing: not restorable, no hit
        (SEED, 1, False, 0),  # one token: rdown(0, 16) = 0
        (SEED, 33, False, 32),  # off the chunk; a resend of 33 restores 32
        (SEED_K2, 48, False, 32),  # chunk 32: 48 is not a multiple; rdown(47, 32) = 32
        (SEED_K2, 64, True, 32),  # on the chunk, but a resend of 64 restores rdown(63, 32) = 32 (#44599)
        (M32_DCP2, 64, True, 32),  # Mamba 32 under DCP 2: same numbers as k = 2 above
        (M32_DCP2, 100, False, 96),  # rdown(99, 32) = 96
        (M16_DCP4, 48, True, 32),  # Mamba 16 under DCP 4: chunk 16; rdown(47, 16) = 32
    ],
)
def test_is_restorable_and_max_restorable_tokens(geom, n, restorable, max_hit):
    assert boundaries.is_restorable(geom, 1, n) is restorable
    assert boundaries.max_restorable_tokens(geom, 1, n) == max_hit
