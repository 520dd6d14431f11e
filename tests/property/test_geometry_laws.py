"""Geometry laws (docs/concepts.md and the offload rules of vLLM 0.33 offloading/config.py).

One test per invariant, named after it. Configs come from ``kvgeom.strategies.configs``
(any DCP size up to 1024, hybrids, uniform containers, replicated windows, offloading,
retention); each test carries the historical failures of docs/cases/ as ``@example``
rows. The law bodies live in ``_laws.py`` so the teeth tests can run them against broken rules.
"""

from __future__ import annotations

import math

import _laws as laws
import pytest
from _laws import H49964, H50287, H50883_D2, H50883_D8, LMC4809
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.strategies import configs


def historical(f):
    """The five historical rows as ``@example`` rows."""
    for cfg in (H49964, H50883_D2, H50883_D8, H50287, LMC4809):
        f = example(cfg=cfg)(f)
    return f


@historical
@given(cfg=configs())
def test_every_generated_config_resolves(cfg):
    # The strategy's promise: valid by construction, so resolve never raises on a drawn config.
    kvgeom.resolve(cfg)


@historical
@given(cfg=configs())
def test_span_is_block_times_shards_for_sharded_groups(cfg):
    laws.check_span(cfg)


@historical
@given(cfg=configs(kinds=["mamba", "full_attention", "mla", "uniform"], min_dcp=2))
def test_mamba_span_is_never_scaled_by_dcp(cfg):
    laws.check_mamba_span(cfg)


@historical
@example(cfg={**H49964, "parallel": {"tp": 2, "dcp": 2, "pcp": 2}})  # PCP next to DCP: still (32, 16)
@given(cfg=configs())
def test_pcp_never_scales_span_by_default(cfg):
    laws.check_pcp_never_scales_span(cfg)


@historical
@given(cfg=configs())
def test_scheduler_block_is_lcm_and_hash_unit_divides_cacheable_spans(cfg):
    laws.check_scheduler_block_and_hash_unit(cfg)


@historical
@given(cfg=configs())
def test_hit_alignment_is_hash_unit_or_scheduler_block(cfg):
    laws.check_hit_alignment(cfg)


@historical
@given(cfg=configs(kinds=["full_attention", "mamba", "uniform", "mla"]))
def test_mamba_row_width_never_divided_by_dcp(cfg):
    laws.check_mamba_row_width(cfg)


@historical
@given(cfg=configs())
def test_row_widths_hold_every_block_the_scheduler_can_allocate(cfg):
    laws.check_row_width_holds_scheduler_blocks(cfg)


@historical
@given(cfg=configs(kinds=["uniform", "full_attention", "mamba"]))
def test_uniform_container_span_equals_its_leaves_span(cfg):
    laws.check_uniform_span_equals_leaves(cfg)


@historical
@given(cfg=configs(offload=True))
def test_offload_chunk_is_span_times_blocks_per_chunk(cfg):
    laws.check_offload_geometry(cfg)


@historical
@given(cfg=configs(kinds=["full_attention", "mamba", "sliding_window", "chunked_local", "uniform"]))
def test_retention_is_multiple_of_scheduler_block_and_windowed_chunks(cfg):
    laws.check_retention(cfg)


@historical
@given(cfg=configs(min_dcp=2))
def test_interleave_divides_every_sharded_block(cfg):
    laws.check_interleave_fits_sharded_blocks(cfg)


# The published numbers of the historical rows (docs/cases/), so the @example rows above are
# known to exercise the right geometry.
PUBLISHED = [
    # #49964 Example 1: spans (32, 16), L 32, H 16, offload tokens_per_block (32, 16)
    ("49964", [32, 16], 32, 16),
    # #50883 Example 5, DCP 2: the DSA wrapper spans 128 = L = H
    ("50883_d2", [128], 128, 128),
    # #50883 / #53889, DCP 8: 512
    ("50883_d8", [512], 512, 512),
    # #50287 Example 4: attention 32, Mamba 16
    ("50287", [32, 16], 32, 16),
    # LMCache #4809 -> #4834 Example 11: attention 9216, Mamba 2304, chunk lcm 9216
    ("lmcache_4809", [9216, 2304], 9216, 2304),
]


@pytest.mark.parametrize(("name", "spans", "L", "H"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_historical_rows_give_the_published_numbers(name, spans, L, H):
    g = kvgeom.resolve(laws.HISTORICAL[name])
    assert [x.span for x in g.groups] == spans
    assert (g.scheduler_block_size, g.hash_block_size) == (L, H)
    assert math.lcm(*spans) == L
    if g.offload is not None:
        assert [o.tokens_per_block for o in g.offload.groups] == spans


def test_historical_mamba_row_is_32_not_16():
    # #50287 Example 4: attention row cdiv(512, 32) = 16, Mamba row cdiv(512, 16) = 32.
    g = kvgeom.resolve(H50287)
    assert [x.row_width for x in g.groups] == [16, 32]


@given(cfg=configs(), tps=st.integers(2, 64), dcp=st.sampled_from([1, 2, 4, 8]))
def test_a_compressed_layer_resolves_only_if_its_per_rank_block_holds_a_state(cfg, tps, dcp):
    # vLLM 0.33 keeps block_size // tokens_per_state states per (per-rank) block and cannot plan a 0-byte page
    # (ZeroDivisionError in get_kv_cache_config_from_groups, run); kvgeom refuses exactly those blocks
    group = {"kind": "mla", "block_size": cfg["groups"][0]["block_size"], "tokens_per_state": tps}
    try:
        geom = kvgeom.resolve({"groups": [group], "parallel": {"tp": dcp, "dcp": dcp}})
    except kvgeom.KVGeomError as e:
        codes = {p.code for p in e.problems}
        assert ("block_smaller_than_state" in codes) == (group["block_size"] < tps), codes
        return
    assert geom.groups[0].block_size >= tps


@given(block=st.integers(1, 4096), tps=st.one_of(st.none(), st.integers(1, 512)))
def test_states_per_block_is_the_page_s_state_count(block, tps):
    # the one home of block_size // tokens_per_state (specs.states_per_block): page bytes scale with it, and it
    # is 0 exactly where resolve refuses block_smaller_than_state
    from kvgeom.pages import attention_page_bytes
    from kvgeom.specs import states_per_block

    s = states_per_block(block, tps)
    assert 0 <= s <= block
    assert (s == 0) == (tps is not None and tps > block)
    page = attention_page_bytes(block_size=block, num_kv_heads=1, head_size=1, head_size_v=0, dtype="int8",
                                tokens_per_state=tps)
    assert page == s
