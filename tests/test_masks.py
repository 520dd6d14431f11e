"""Example table for ``masks.reachable_block_mask``: which blocks a store keeps (docs/hits.md).

Each answer is worked out by hand from the rule in the docstring: an align-mode Mamba block ``i`` holds the
state after ``(i+1)*B_m`` tokens and is kept when that boundary is a multiple of the retention interval R or
the last block boundary at or below an aligned reachable boundary; ``None`` means every block. Rows found
by mutation testing (docs/mutation.md): the explicit ``retention``/``alignment``/``first_block`` arguments
and the families that store densely were only covered by doctests.
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom.masks import reachable_block_mask

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # group 1: align Mamba 16; config R = 0, hit alignment 16
WIDE_MAMBA = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
                                        {"kind": "mamba", "block_size": 64}],
                            "parallel": {"tp": 2, "dcp": 2}, "cache": {"prefix_match_unit": 16}, "offload": {}})
CROSS = kvgeom.resolve(
    {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "cross_attention", "block_size": 16}]}
)
CIRCULAR = kvgeom.resolve(
    {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "circular_buffer", "block_size": 16}]}
)
CHUNKED = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64},
        ]
    }
)
HISPARSE = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                      {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 2}]})
ENCODER = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                     {"kind": "encoder_only", "block_size": 16, "num_kv_heads": 1, "head_size": 8,
                                      "dtype": "float16"}]})
# FA 16 + SWA (block 16, window 17): a hit needs cdiv(16, 16) = 1 block before its boundary, and a segment
# (alignment 16) is one block long
SWA_ONE = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 17},
        ],
        "offload": {},
    }
)

# FA 16 + SWA (block 16, window 32) marked drafter, EAGLE K = 1, offloaded (so legacy hashes and the drop):
# under the drop a run is cdiv(31, 16) + 1 = 3 blocks and ends one block past its boundary (issue 19; the
# rows below were run through vLLM 0.33's Scheduler, see tests/test_store_plans.py and tests/test_sim.py)
SWA_EAGLE = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 32, "drafter": True},
        ],
        "speculative": {"method": "eagle", "num_speculative_tokens": 1},
        "offload": {},
    }
)

# SWA_EAGLE's groups and speculative switches without an offload section: the same GPU-side managers (the
# drop on for group 1), and no connector, so a mask is the GPU prefix cache's by default
SWA_EAGLE_GPU = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 32, "drafter": True},
        ],
        "speculative": {
            "method": "eagle",
            "num_speculative_tokens": 1,
            "eagle_block_drop": True,
            "lookahead_hashes": False,
        },
    }
)
# FA 64 + SWA 16 (window 17) marked drafter, EAGLE K = 1, offloaded, retention null: a run is 2 blocks of a 4-block
# segment, one block past each 64-token boundary. vLLM 0.33 stores 64, 80 of a 120-token prompt (run 2026-12-02):
# blocks 3, 4 and no tail of the last, partial segment (an EAGLE group has no store horizon)
EAGLE_R_NONE = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 64},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 17, "drafter": True},
        ],
        "speculative": {"method": "eagle", "num_speculative_tokens": 1},
        "cache": {"retention_interval": None},
        "offload": {},
    }
)

# (geometry, group, num_blocks, keyword arguments, expected mask or None for every block)
ROWS = [
    # EAGLE, R = 64 (4 blocks a segment): blocks 2-4, 6-8, 10-12 -- ends 48-80, 112-144, 176-208
    (SWA_EAGLE, 1, 13, {"retention": 64}, {2, 3, 4, 6, 7, 8, 10, 11, 12}),
    # EAGLE, R = 0: the run at rdown(199, 16) = 192 is blocks [13 - 3, 13) (ends 176, 192, 208)
    (SWA_EAGLE, 1, 13, {"retention": 0, "reachable": [199]}, {10, 11, 12}),
    # the GPU side answers the same here (the group is in the GPU drop set; no extra_retained_tokens)
    (SWA_EAGLE, 1, 13, {"retention": 0, "reachable": [176], "side": "gpu"}, {9, 10, 11}),
    # without an offload section the default side is the GPU's: the vLLM GPU-side row above, {9, 10, 11}
    (SWA_EAGLE_GPU, 1, 13, {"retention": 0, "reachable": [176]}, {9, 10, 11}),
    # an EAGLE group keeps no final-segment tail even when a final segment end is passed (vLLM run: 64, 80)
    (EAGLE_R_NONE, 1, 7, {"retention": None, "final_segment_end_block": 7}, {3, 4}),
    # EAGLE, R = None: 3 blocks needed of a 1-block segment: dense
    (SWA_EAGLE, 1, 13, {"retention": None}, None),
    # EAGLE, first_block past the first runs: only what is left of [6, 9) and [10, 13)
    (SWA_EAGLE, 1, 13, {"retention": 64, "first_block": 7}, {7, 8, 10, 11, 12}),
    # R = 32: blocks ending at 32, 64 (blocks 1, 3) — the explicit retention wins over the config's R = 0
    (SEED, 1, 4, {"retention": 32, "alignment": 32}, {1, 3}),
    # the config's R = 0 and no reachable boundary: nothing is worth storing
    (SEED, 1, 4, {}, set()),
    # reachable boundary 16 at the default alignment 16: block 0 (ends at 16) too
    (SEED, 1, 4, {"retention": 32, "reachable": [16]}, {0, 1, 3}),
    # the same boundary at an explicit alignment 32 rounds down to 0: no extra block
    (SEED, 1, 4, {"retention": 32, "alignment": 32, "reachable": [16]}, {1, 3}),
    # R = 0: only the aligned reachable boundary 40 -> 32 (block 1)
    (SEED, 1, 4, {"retention": 0, "alignment": 16, "reachable": [40]}, {1}),
    # a reachable boundary past the range keeps nothing
    (SEED, 1, 4, {"retention": 0, "alignment": 16, "reachable": [80]}, set()),
    # first_block 3 with R = 32: blocks 3 and 5 of [3, 6) (block 1 is before the range)
    (SEED, 1, 6, {"retention": 32, "alignment": 32, "first_block": 3}, {3, 5}),
    # first_block 2: same answer (block 2 ends at 48, not a multiple of 32)
    (SEED, 1, 6, {"retention": 32, "alignment": 32, "first_block": 2}, {3, 5}),
    # R = 64: blocks ending at 64, 128 -> 3, 7; first_block 4 leaves 7
    (SEED, 1, 8, {"retention": 64, "alignment": 64, "first_block": 4}, {7}),
    # R equal to the block span: every block ends on a multiple of R -> dense
    (SEED, 1, 4, {"retention": 16, "alignment": 16}, None),
    # R off the block grid (24 over 16-token blocks): stays dense
    (SEED, 1, 4, {"retention": 24, "alignment": 16}, None),
    # a reachable boundary off the Mamba block grid keeps the last block at or below it (vLLM 0.33
    # MambaManager.reachable_block_mask floors): FA64 + Mamba64 under DCP 2, A = 16, boundary 177 ->
    # rdown(177, 16) = 176 -> block 176 // 64 - 1 = 1 (the state at 128; vLLM run: Mamba 128 is stored)
    (WIDE_MAMBA, 1, 4, {"reachable": (177,)}, {1}),
    # a boundary below the first block keeps nothing
    (WIDE_MAMBA, 1, 4, {"reachable": (63,)}, set()),
    # no retention interval: dense
    (SEED, 1, 4, {"retention": None}, None),
    # no alignment to thin against: dense
    (SEED, 1, 4, {"retention": 32, "alignment": None}, None),
    # sliding window whose needed tail (1 block) covers a whole segment (1 block): dense, answered without
    # listing 2^30 blocks (listing them would be refused as too large)
    (SWA_ONE, 1, 1 << 30, {"retention": None}, None),
    # attention, cross-attention, circular buffer and chunked local groups store every block
    (SEED, 0, 4, {"retention": 32, "alignment": 32}, None),
    (CROSS, 1, 4, {"retention": 32, "alignment": 32}, None),
    (CIRCULAR, 1, 4, {"retention": 32, "alignment": 32}, None),
    (CHUNKED, 1, 4, {"retention": 32, "alignment": 32}, None),
    # HiSparse and encoder-only groups (never prefix-cached or offloaded) take the dense answer too
    (HISPARSE, 1, 4, {"retention": 32, "alignment": 32}, None),
    (ENCODER, 1, 4, {"retention": 32, "alignment": 32}, None),
]


@pytest.mark.parametrize(("geom", "group", "n", "kwargs", "expected"), ROWS)
def test_reachable_block_mask(geom, group, n, kwargs, expected):
    mask = reachable_block_mask(geom, group, n, **kwargs)
    assert (None if mask is None else set(mask)) == expected


def test_sliding_window_mask_far_from_block_zero_is_sized_by_its_own_range():
    # SWA_ONE with R = 1024: segments of 64 blocks, the last block of each kept. 2^25 blocks starting at
    # block 2^34 hold 2^19 segments: 2^19 blocks are kept, far below the 2^24 refusal bound; an estimate that
    # counted the segments before first_block would refuse this.
    lo, n = 1 << 34, (1 << 34) + (1 << 25)
    mask = reachable_block_mask(SWA_ONE, 1, n, first_block=lo, retention=1024)
    assert mask is not None
    assert len(mask) == 1 << 19
    assert min(mask) == lo + 63 and max(mask) == n - 1
    assert all(b % 64 == 63 for b in mask)


def test_a_mask_side_other_than_offload_or_gpu_is_refused():
    with pytest.raises(kvgeom.QueryError) as e:
        reachable_block_mask(SWA_EAGLE, 1, 4, side="cpu")
    assert e.value.problems[0].code == "bad_side"


@pytest.mark.parametrize(
    ("first_block", "kept"),
    [
        # vLLM 0.33's EAGLE mask of the R = 64 row above ({2, 3, 4, 6, 7, 8, 10, 11, 12} over 13 blocks, run
        # through its Scheduler) cut to [first_block, 13), where whole runs (or the range) bound the count
        (0, {2, 3, 4, 6, 7, 8, 10, 11, 12}),
        (6, {6, 7, 8, 10, 11, 12}),  # from the second segment on
        (11, {11, 12}),  # the range is shorter than its segment's run
    ],
)
def test_a_sliding_window_mask_of_exactly_the_scalar_bound_is_answered(monkeypatch, first_block, kept):
    """The scalar bound (``MAX_SCALAR_RESULT``, 2^24 blocks) on a small mask: the bound lowered to the mask's
    own size answers it, one less refuses it (``result_too_large``). A mask of 2^24 blocks would take seconds
    and gigabytes; the rule is the same at any bound. (Where whole runs fill the range, the size check's
    estimate is the mask's size; elsewhere it may be above it, so these rows stay where it is exact.)"""
    monkeypatch.setattr(kvgeom.masks, "MAX_SCALAR_RESULT", len(kept))
    mask = reachable_block_mask(SWA_EAGLE, 1, 13, retention=64, first_block=first_block)
    assert mask is not None and set(mask) == kept
    monkeypatch.setattr(kvgeom.masks, "MAX_SCALAR_RESULT", len(kept) - 1)
    with pytest.raises(kvgeom.QueryError) as info:
        reachable_block_mask(SWA_EAGLE, 1, 13, retention=64, first_block=first_block)
    assert (info.value.problems[0].code, info.value.problems[0].field) == ("result_too_large", "num_blocks")


def test_a_final_segment_tail_starts_at_first_block():
    """FA 64 + SWA 16 (window 49: 3 blocks of 4 a segment), retention null: vLLM 0.33 stores 32, 48, 64, 80, 96,
    112 of a 120-token prompt (run 2026-12-02; blocks 1-3 and the last, partial segment's 4-6). Cut to blocks
    [5, 7), the final tail keeps 5 and 6 only: block 4 is below first_block."""
    g = kvgeom.resolve(
        {
            "groups": [
                {"kind": "full_attention", "block_size": 64},
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 49},
            ],
            "cache": {"retention_interval": None},
            "offload": {},
        }
    )
    mask = reachable_block_mask(g, 1, 7, first_block=5, retention=None, final_segment_end_block=7)
    assert mask is not None and set(mask) == {5, 6}
    assert set(reachable_block_mask(g, 1, 7, retention=None, final_segment_end_block=7)) == {1, 2, 3, 4, 5, 6}


def test_the_default_side_without_a_connector_is_the_gpus():
    """``mask_side`` names the GPU prefix cache's side when the geometry has no offload section."""
    from kvgeom.masks import mask_side

    assert mask_side(SWA_EAGLE_GPU, None) == "gpu"
    assert mask_side(SWA_EAGLE, None) == "offload"


# swa_run / swa_store_horizon outside their usual inputs (mutation pass 4: masks.swa_run 4, 10, 11, 21 and
# swa_store_horizon 31 passed every table). The contracts are the docstrings': (0, 0) for every family but the
# sliding window; on the connector's side of a geometry with no offload section no group runs the EAGLE drop
# (the LMCache model asks that side of geometries without vLLM's connector).
SWA_NO_OFFLOAD = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                            {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
                                 "cache": {"retention_interval": None}})
CHUNKED_OFFLOAD = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                             {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
                                  "offload": {}})


@pytest.mark.parametrize("side", [None, "offload", "gpu"])
def test_swa_run_is_zero_for_every_family_but_the_sliding_window(side):
    from kvgeom.masks import swa_run

    for geom, group in ((CHUNKED_OFFLOAD, 0), (CHUNKED_OFFLOAD, 1), (CHUNKED, 1), (SEED, 1), (CIRCULAR, 1)):
        assert swa_run(geom, group, side) == (0, 0), (geom.groups[group].family, side)


def test_the_connector_side_of_a_geometry_without_offload_has_no_eagle_group():
    from kvgeom.masks import swa_run, swa_store_horizon

    # window 40: the run needs cdiv(39, 16) = 3 blocks and ends at its boundary, on either side
    assert swa_run(SWA_NO_OFFLOAD, 1, "offload") == swa_run(SWA_NO_OFFLOAD, 1, "gpu") == (3, 0)
    # retention None, not EAGLE: a finished request's last segment ends at its storable chunks, as with a connector
    assert swa_store_horizon(SWA_NO_OFFLOAD, 1, storable_chunks=3, prompt_chunks=7, finished=True) == 3
    assert swa_store_horizon(SWA_NO_OFFLOAD, 1, storable_chunks=3, prompt_chunks=7, finished=False) == 7
