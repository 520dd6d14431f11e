"""Laws of SGLang's geometry in kvgeom (``kvgeom/engines/sglang.py``), each named after its invariant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.engines.sglang import (
    SGLangConfigError,
    checkpoint_positions,
    dcp_transfer_plan,
    prefix_hit,
    resolve_sglang,
)

pow2 = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256])


@st.composite
def deployments(draw: st.DrawFn) -> dict:
    dcp = draw(st.sampled_from([1, 2, 4, 8]))
    return {
        "page_size": draw(pow2),
        "dcp_size": dcp,
        "tp_size": dcp * draw(st.sampled_from([1, 2])),
        "pools": draw(st.sampled_from([["full"], ["full", "mamba"], ["mla", "mamba"], ["full", "swa"]])),
        "mamba_chunk_size": draw(st.none() | st.sampled_from([64, 128, 192, 256])),
        "mamba_track_interval": draw(st.sampled_from([64, 128, 256, 384, 512, 1024])),
        "speculative_num_draft_tokens": draw(st.none() | st.integers(1, 8)),
        "chunked_prefill_size": draw(st.none() | st.sampled_from([-1, 32, 8192])),
        "checkpoint_grid": draw(st.sampled_from(["lcm", "lcm", "chunk"])),
    }


def _resolve_or_none(cfg: dict):
    try:
        return resolve_sglang(cfg)
    except SGLangConfigError as e:
        assert e.problems and all(p.field.startswith("sglang.") for p in e.problems)
        return None


@given(deployments())
def test_tree_page_is_event_block_and_hicache_page(cfg):
    g = _resolve_or_none(cfg)
    if g is not None:
        assert g.tree_page == cfg["page_size"] * cfg["dcp_size"] == g.kv_event_block_size == g.hicache_logical_page


@given(deployments())
def test_checkpoint_grid_is_the_smallest_common_multiple(cfg):
    g = _resolve_or_none(cfg)
    if g is None or g.checkpoint_grid is None or cfg["checkpoint_grid"] != "lcm":
        return
    assert g.checkpoint_grid % g.tree_page == 0 and g.checkpoint_grid % g.mamba_chunk == 0
    assert not any(m % g.tree_page == 0 for m in range(g.mamba_chunk, g.checkpoint_grid, g.mamba_chunk))
    assert g.track_grid % g.checkpoint_grid == 0 and g.track_grid % cfg["mamba_track_interval"] == 0


@given(deployments(), st.integers(0, 5000))
def test_checkpoints_lie_on_the_tree_page(cfg, n):
    g = _resolve_or_none(cfg)
    if g is None or cfg["checkpoint_grid"] != "lcm":
        return
    assert all(c % g.tree_page == 0 and 0 < c <= n for c in checkpoint_positions(g, n))


@given(deployments(), st.integers(0, 5000))
def test_a_hit_never_exceeds_the_match(cfg, n):
    g = _resolve_or_none(cfg)
    if g is None:
        return
    cps = checkpoint_positions(g, n)
    hit = prefix_hit(g, n, cps)
    assert 0 <= hit.hit_tokens <= hit.full_kv_hit <= n and hit.full_kv_hit % g.tree_page == 0
    if hit.mamba_branch_point:
        assert hit.mamba_branch_point in cps


@given(deployments())
def test_a_pre_fix_grid_off_the_tree_page_is_refused(cfg):
    """The #34808 family: a chunk grid that is not on the tree page never resolves silently."""
    cfg = {**cfg, "checkpoint_grid": "chunk", "pools": ["full", "mamba"]}
    chunk = max(cfg["mamba_chunk_size"] or 64, cfg["page_size"])
    g = _resolve_or_none(cfg)
    if g is not None:
        assert chunk % g.tree_page == 0


@given(st.integers(0, 64), pow2, st.sampled_from([1, 2, 4, 8]), st.integers(0, 3), st.integers(0, 4))
def test_target_rows_partition_the_tokens(n, page, dcp, prefix_pages, offset):
    prefix = prefix_pages * page * dcp
    plans = [dcp_transfer_plan(n, physical_page_size=page, dcp_size=dcp, dcp_rank=r, decode_prefix_len=prefix,
                               src_page_offset=offset) for r in range(dcp)]
    rows = sorted(t for p in plans for t in p.target_src)
    assert rows == list(range(n))
    assert all(p.draft_src == tuple(range(n)) for p in plans)


def test_examples():
    # DCP 2 on 64-token pages: tree page 128; the model chunk 192 is not a multiple of it, so the lcm
    # grid is 384 (#34808 fix) and kvgeom warns that checkpoints are sparser than the chunk.
    g = resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
                        "mamba_chunk_size": 192, "mamba_track_interval": 768})
    assert (g.tree_page, g.checkpoint_grid, g.track_grid) == (128, 384, 768)
    assert [w.code for w in g.warnings] == ["checkpoint_grid_widened"]
    # the same on a pre-fix build: an error naming the numbers and the fix
    with pytest.raises(SGLangConfigError) as e:
        resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
                        "mamba_chunk_size": 192, "checkpoint_grid": "chunk"})
    assert e.value.code == "checkpoint_off_tree_page" and e.value.values == {"mamba_chunk": 192, "tree_page": 128,
                                                                             "lcm": 384}
    # validators: no_buffer needs page 1 and no overlap; the track interval is >= draft tokens, a page multiple
    with pytest.raises(SGLangConfigError) as e:
        resolve_sglang({"page_size": 16, "pools": ["full", "mamba"], "mamba_radix_cache_strategy": "no_buffer",
                        "mamba_track_interval": 8})
    assert [p.code for p in e.value.problems] == ["no_buffer_page_size", "no_buffer_overlap"]
    with pytest.raises(SGLangConfigError) as e:
        resolve_sglang({"page_size": 16, "pools": ["full", "mamba"], "mamba_track_interval": 24,
                        "speculative_num_draft_tokens": 32})
    assert [p.code for p in e.value.problems] == ["track_interval_below_draft", "track_interval_page"]
    # malformed input is a ConfigError naming the sglang field
    with pytest.raises(kvgeom.ConfigError) as c:
        resolve_sglang({"page_size": 16, "pools": ["nope"]})
    assert c.value.field.startswith("sglang.pools")
    with pytest.raises(kvgeom.ConfigError) as c:
        resolve_sglang({"page_sise": 16})
    assert c.value.field == "sglang.page_sise"


def test_hicache_dcp_rules():
    base = {"page_size": 16, "dcp_size": 2, "tp_size": 4, "enable_hierarchical_cache": True,
            "hicache_storage_backend": "file"}
    with pytest.raises(SGLangConfigError) as e:
        resolve_sglang({**base, "pools": ["full"]})
    assert e.value.code == "hicache_dcp_needs_mla"
    assert resolve_sglang({**base, "pools": ["mla"]}).hicache_logical_page == 32
    assert math.lcm(64, 32) == 64
