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
    swa_tombstones,
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


# -- sliding-window hits -----------------------------------------------------------------------------------
@st.composite
def swa_paths(draw: st.DrawFn) -> tuple:
    """A full + SWA (optionally + Mamba) deployment and one prompt's path: matched tokens, tombstones on
    page boundaries, checkpoints, and the node ends SGLang's tree has there (page ends, at random)."""
    page = draw(st.sampled_from([1, 2, 4, 16]))
    window = draw(st.integers(1, 40))
    draft = draw(st.sampled_from([0, 0, 8, 64]))
    mamba = page == 1 and draw(st.booleans())
    pages = draw(st.integers(0, 24))
    dead = draw(st.lists(st.booleans(), min_size=pages, max_size=pages))
    cfg = {"page_size": page, "pools": ["full", "swa", "mamba"] if mamba else ["full", "swa"],
           "sliding_window_size": window, "draft_swa_window": draft}
    if mamba:
        cfg.update(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
    ends = sorted({page * (i + 1) for i in range(pages) if draw(st.booleans())} | {page * pages})
    # a tombstone is a whole node: node ends bound every dead run
    tombs, prev = [], 0
    for e in ends:
        if dead[e // page - 1] if e else False:
            tombs.append((prev, e))
        prev = e
    cps = [e for e in ends if e and draw(st.booleans())] if mamba else []
    extra = draw(st.integers(0, page - 1))
    return resolve_sglang(cfg), page * pages + extra, ends, tombs, cps


def _walk(window, ends, tombs, cps, mamba):
    """SGLang's match walk node by node: each component's validator, the deepest node all accept."""
    dead = {e for _, e in tombs}
    run, best, prev = math.inf, 0, 0
    for e in ends:
        if e == 0:
            continue
        if e in dead:
            run, ok = 0, False
        else:
            run += e - prev
            ok = run >= window
        if ok and (not mamba or e in cps):
            best = e
        prev = e
    return best


@given(swa_paths())
def test_swa_hit_is_the_deepest_node_every_validator_accepts(case):
    # the run-end rule of prefix_hit agrees with a node-by-node walk over any node ends the tree may have
    g, matched, ends, tombs, cps = case
    hit = prefix_hit(g, matched, cps, swa_tombstones=tombs)
    assert hit.device_prefix == _walk(g.swa_window, ends, tombs, cps, g.checkpoint_grid is not None)


@given(swa_paths())
def test_swa_hit_bounds(case):
    g, matched, _ends, tombs, cps = case
    hit = prefix_hit(g, matched, cps, swa_tombstones=tombs)
    assert hit.device_prefix <= hit.full_kv_hit <= matched and hit.full_kv_hit % g.tree_page == 0
    assert not any(s < hit.device_prefix <= e for s, e in tombs)  # never ends inside a tombstone
    if hit.mamba_branch_point is not None:
        assert hit.device_prefix <= hit.mamba_branch_point
    assert prefix_hit(g, matched, cps).device_prefix >= hit.device_prefix  # tombstones only take away


@given(st.sampled_from([1, 4, 16]), st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=6))
def test_swa_tombstones_are_sorted_disjoint_pages_inside_the_path(page, raw):
    g = resolve_sglang({"page_size": page, "pools": ["full", "swa"], "sliding_window_size": 8})
    inserts = [(a * page, b * page) for a, b in raw]
    tombs = swa_tombstones(g, inserts)
    assert all(a < b and a % page == 0 and b % page == 0 for a, b in tombs)
    assert all(tombs[i][1] < tombs[i + 1][0] for i in range(len(tombs) - 1))
    assert all(b <= max(n for n, _ in inserts) for _, b in tombs)
    assert swa_tombstones(g, [(n, 0) for n, _ in inserts]) == ()


def test_swa_examples():
    w = resolve_sglang({"pools": ["full", "swa"], "sliding_window_size": 4})
    assert w.swa_window == 4 and w.to_dict()["swa_window"] == 4
    # a fused draft reading 6 tokens back widens what the tree keeps
    assert resolve_sglang({"pools": ["full", "swa"], "sliding_window_size": 4, "draft_swa_window": 6}).swa_window == 6
    # no tombstone: every matched page is reusable, whatever the window
    assert prefix_hit(w, 3).device_prefix == 3
    # the window counts from the end of the last tombstone: [0, 6) evicted, 4 needed
    assert [prefix_hit(w, n, swa_tombstones=[(0, 6)]).device_prefix for n in (6, 9, 10, 12)] == [0, 0, 10, 12]
    # two dead runs: a match ending short of the window after the second falls back to the first one's start
    assert prefix_hit(w, 14, swa_tombstones=[(2, 4), (10, 12)]).device_prefix == 10
    assert prefix_hit(w, 13, swa_tombstones=[(2, 4), (10, 12)]).device_prefix == 10
    # insert rule: the live window is recovered, older tokens keep what the tree held
    assert swa_tombstones(w, [(12, 8), (12, 4)]) == ((0, 4),)
    # bad input names the field
    with pytest.raises(kvgeom.QueryError) as q:
        prefix_hit(resolve_sglang({"pools": ["full", "swa"]}), 8, swa_tombstones=[(0, 4)])
    assert q.value.code == "swa_tombstones_without_window" and "sliding_window_size" in str(q.value)
    with pytest.raises(kvgeom.QueryError) as q:
        prefix_hit(w, 8, swa_tombstones=[(4, 2)])
    assert q.value.code == "bad_swa_tombstone"
    with pytest.raises(kvgeom.QueryError) as q:
        swa_tombstones(resolve_sglang({"page_size": 4, "pools": ["full", "swa"], "sliding_window_size": 4}),
                       [(8, 2)])
    assert q.value.code == "bad_swa_insert" and "evicted_tokens=2" in str(q.value)
