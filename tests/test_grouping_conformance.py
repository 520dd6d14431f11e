"""Which layer sits in which group, and each layer's block: ``kvgeom.resolve_block_sizes`` against vLLM 0.33's
own ``get_kv_cache_groups`` (``kvgeom.conformance.vllm_grouping``; marked ``vllm``, runs in the vLLM venv).

Rows pin vLLM's membership on the cases that show the rule (a bucket dealt round-robin over its groups,
pipeline stages mixed in one group) and, under a block-outermost ``model.kv_cache_layout``, vLLM's packed
grouping (step 5b); the law runs vLLM on generated layered models of every layout.
"""

from __future__ import annotations

import pytest
from _vllm import NEEDS_VLLM
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kvgeom
from kvgeom.resolution import resolve_block_sizes

pytestmark = NEEDS_VLLM

vg = pytest.importorskip("kvgeom.conformance.vllm_grouping")


def _attn(kind, count, heads=2, stage=0, **kw):
    return {"kind": kind, "num_kv_heads": heads, "head_size": 128, "dtype": "bfloat16", "count": count,
            "pp_stage": stage, **kw}


def _mamba(count, stage=0):
    return {"kind": "mamba", "shapes": [[16, 64, 64]], "dtypes": ["float32"], "count": count, "pp_stage": stage}


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [
        # 12 sliding + 18 full: group size 12, the full bucket split in two; vLLM deals its layers
        # round-robin: evens in one group, odds in the other (9 + 9), not 12 + 6
        ([_attn("sliding_window", 12, sliding_window=512), _attn("full_attention", 18)], 1,
         [12, 9, 9]),
        # #51752's model: 2 attention + 2 Mamba on stage 0, 4 Mamba on stage 1: the 6 Mamba layers over 3
        # groups as (m0, m3), (m1, m4), (m2, m5), so two groups hold layers of both stages
        ([_attn("full_attention", 2), _mamba(2), _mamba(4, stage=1)], 2, [2, 2, 2, 2]),
        # one sliding layer per three full: group size 1, one group per layer, in model order per bucket
        ([_attn("full_attention", 3), _attn("sliding_window", 1, sliding_window=64)], 1, [1, 1, 1, 1]),
        # two windows, one block, heads and dtype: vLLM 0.33 keeps one group only for one window width
        # (found by the law below under the dev profile; kvgeom made one group of both)
        ([_attn("sliding_window", 1, sliding_window=64), _attn("sliding_window", 1, sliding_window=512)], 1,
         [1, 1]),
        ([_attn("sliding_window", 4, sliding_window=64), _attn("sliding_window", 3, sliding_window=512)], 1,
         [4, 3]),
        # the same for chunked-local layers of two chunk sizes: a bucket per chunk, then split by the smallest
        ([_attn("chunked_local", 2, attention_chunk_size=256), _attn("chunked_local", 1, attention_chunk_size=512)],
         1, [1, 1, 1]),
    ],
)
def test_membership_is_vllms(layers, pp, expected):
    r = resolve_block_sizes({"model": {"block_size": 16, "layers": layers}, "parallel": {"pp": pp}})
    theirs = vg.vllm_grouping(r)
    assert [len(m) for m in theirs.group_layers] == expected  # vLLM's numbers
    assert r.group_layers == theirs.group_layers  # kvgeom's membership is vLLM's, layer by layer
    assert r.layer_block_sizes() == theirs.layer_block_sizes


def test_per_layer_blocks_differ_when_unification_scales_one_kind():
    # full attention 2 heads next to sliding window 4 heads: the full page (half the sliding one) divides it,
    # so the full layers run with 32-token blocks and the sliding layers with 16 (page unification, step 4)
    layers = [_attn("full_attention", 2), _attn("sliding_window", 2, heads=4, sliding_window=1024)]
    r = resolve_block_sizes({"model": {"block_size": 16, "layers": layers}})
    assert r.layer_block_sizes() == (("layers[0]#0", 32), ("layers[0]#1", 32), ("layers[1]#0", 16),
                                     ("layers[1]#1", 16))
    assert vg.vllm_grouping(r).layer_block_sizes == r.layer_block_sizes()


# Block-outermost layouts with layers of different pages: vLLM 0.33's packed grouping (_get_packed_kv_cache_groups).
# Numbers seen on vLLM 0.33 (the harness's answer), pinned again without vLLM in tests/test_resolution.py.
_MLA = {"kind": "mla", "head_size": 576, "dtype": "bfloat16"}
_IDX = {"kind": "mla", "head_size": 132, "dtype": "bfloat16", "cache_role": "indexer"}


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [
        # 1:1 full 2 heads / sliding 4 heads (pages 8 KiB, 16 KiB): two single-page buckets, no repeating
        # pattern; the sliding bucket is a state bucket and a block holds 4 full pages = 2 sliding ones,
        # so it splits in two (s0, s2), (s1, s3); blocks stay 16 (layer-outermost: full 32, 2 groups)
        ([_attn("full_attention", 1), _attn("sliding_window", 1, heads=4, sliding_window=512)] * 4, 1, [4, 2, 2]),
        # full 2 and 4 heads 1:1 (one bucket, two pages, balanced: 4 repeats) + 4 sliding: 4 repeats per group,
        # each bucket one group; the full group keeps model order (a0, b0, a1, b1, ...)
        ([_attn("full_attention", 1), _attn("full_attention", 1, heads=4),
          _attn("sliding_window", 1, sliding_window=64)] * 4, 1, [8, 4]),
        # the same full pattern + 12 sliding: approximate gcd of (4, 12) from 4 is 4, so 12 sliding make 3 groups
        ([_attn("full_attention", 1), _attn("full_attention", 1, heads=4)] * 4
         + [_attn("sliding_window", 12, sliding_window=64)], 1, [8, 4, 4, 4]),
        # 4 + 2 full layers of two pages (2:1, unbalanced): the bucket is kept whole
        ([_attn("full_attention", 4), _attn("full_attention", 2, heads=4),
          _attn("sliding_window", 3, sliding_window=64)], 1, [6, 3]),
        # hybrid: full 2 / 4 heads 1:1 + 8 Mamba: the widest group (one full pattern = 2 + 4 heads pages) fits
        # two Mamba states, so the Mamba bucket splits in four pairs (m0, m4), (m1, m5), ...
        ([_attn("full_attention", 1), _attn("full_attention", 1, heads=4)] * 2 + [_mamba(8)], 1, [4, 2, 2, 2, 2]),
        # hybrid without a repeating pattern: 2 full + 2 sliding 4 heads + 6 Mamba; sliding and Mamba both
        # state buckets: 1 sliding page and 2 Mamba states per block -> (s0), (s1), 3 Mamba pairs
        ([_attn("full_attention", 2), _attn("sliding_window", 2, heads=4, sliding_window=64), _mamba(6)], 1,
         [2, 1, 1, 2, 2, 2]),
        # DSA-like MLA + indexer 1:1 + 6 sliding layers: (MLA, indexer) x3 balanced, 3 repeats per group, the
        # sliding bucket (6 repeats) in two groups; under a layer-outermost layout this model is refused
        # (the indexer page does not divide the MLA page: mla_page_not_divisible)
        ([_MLA, _IDX] * 3 + [_attn("sliding_window", 6, heads=1, sliding_window=128)], 1, [6, 3, 3]),
        # the same with 6 Mamba layers (the MLA hybrid block: 256)
        ([_MLA, _IDX] * 3 + [_mamba(6)], 1, [6, 3, 3]),
        # two pipeline stages: buckets span both stages, packing is over all stages' layers
        ([_attn("full_attention", 2), _attn("full_attention", 1, heads=4), _mamba(2), _mamba(4, stage=1),
          _attn("full_attention", 1, heads=4, stage=1)], 2, [4, 2, 2, 2]),
    ],
)
@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC", "BHLNC"])
def test_packed_grouping_is_vllms(layers, pp, expected, layout):
    cfg = {"model": {"block_size": 16, "kv_cache_layout": layout, "layers": layers}, "parallel": {"pp": pp}}
    r = resolve_block_sizes(cfg)
    theirs = vg.vllm_grouping(r)
    assert r.packed
    assert [len(m) for m in theirs.group_layers] == expected  # vLLM's numbers
    assert vg.differences(r) == {}  # membership, order and every layer's block are vLLM's


def _vllm_packed(specs):
    """vLLM 0.33's get_kv_cache_groups under BLHNC on hand-built specs (for a model kvgeom refuses)."""
    from types import SimpleNamespace

    from vllm.config import CacheConfig
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups

    cache = CacheConfig()
    cache.kv_cache_layout = "BLHNC"
    config = SimpleNamespace(scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
                             cache_config=cache, attention_config=None)
    return get_kv_cache_groups(config, specs)


def test_an_unbalanced_state_bucket_split_by_packing_is_refused_as_vllm_drops_its_layers():
    # one full layer (1 head) + sliding layers of one window with 2 and 4 heads (two pages, unbalanced): no
    # repeating pattern, so the sliding bucket is a state bucket split to fit the block; vLLM pairs its pages
    # with zip: 4 + 2 layers -> 2 groups (s0, t0), (s1, t1) and s2, s3 in no group; 3 + 1 -> an empty group
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    def full(h):
        return FullAttentionSpec(block_size=16, num_kv_heads=h, head_size=128, dtype=torch.bfloat16)

    def sw(h):
        return SlidingWindowSpec(block_size=16, num_kv_heads=h, head_size=128, dtype=torch.bfloat16, sliding_window=64)

    specs = {"f": full(1), **{f"s{i}": sw(2) for i in range(4)}, "t0": sw(4), "t1": sw(4)}
    groups = _vllm_packed(specs)
    assert [g.layer_names for g in groups] == [["f"], ["s0", "t0"], ["s1", "t1"]]  # s2, s3 dropped
    with pytest.raises(StopIteration):
        _vllm_packed({"f": full(1), **{f"s{i}": sw(2) for i in range(3)}, "t0": sw(4)})
    for n_small, n_big in [(4, 2), (3, 1)]:
        layers = [_attn("full_attention", 1, heads=1), _attn("sliding_window", n_small, sliding_window=64),
                  _attn("sliding_window", n_big, heads=4, sliding_window=64)]
        with pytest.raises(kvgeom.GeometryError) as e:
            resolve_block_sizes({"model": {"kv_cache_layout": "BLHNC", "layers": layers}})
        assert e.value.problems[0].code == "packed_bucket_unbalanced"
        assert e.value.problems[0].field == "model.kv_cache_layout"


_KINDS = ["full_attention", "sliding_window", "chunked_local", "mla", "mamba"]


@st.composite
def layered_models(draw):
    """Layered models of 1-4 entries of the kinds the resolver takes, 1-20 layers each, over 1-2 stages, under
    no ``kv_cache_layout`` (the default), a layer-outermost one or a block-outermost one (packed grouping)."""
    pp = draw(st.integers(1, 2))
    layers = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(_KINDS))
        count, stage = draw(st.integers(1, 20)), draw(st.integers(0, pp - 1))
        if kind == "mamba":
            layers.append(_mamba(count, stage))
        elif kind == "mla":
            layers.append({"kind": "mla", "head_size": 576, "dtype": "bfloat16", "count": count, "pp_stage": stage})
        else:
            extra = {"sliding_window": draw(st.sampled_from([64, 512]))} if kind == "sliding_window" else {}
            if kind == "chunked_local":
                extra = {"attention_chunk_size": draw(st.sampled_from([256, 512]))}
            layers.append(_attn(kind, count, heads=draw(st.sampled_from([1, 2, 4])), stage=stage, **extra))
    model = {"block_size": draw(st.sampled_from([16, 64])), "layers": layers}
    layout = draw(st.sampled_from([None, "LBNHC", "BLHNC", "BLNHC", "BHLNC"]))  # None: today's default
    if layout is not None:
        model["kv_cache_layout"] = layout
    return {"model": model, "parallel": {"pp": pp}}


@settings(max_examples=40, deadline=None)
@given(cfg=layered_models())
def test_group_membership_and_layer_blocks_are_vllms(cfg):
    try:
        r = resolve_block_sizes(cfg)
    except kvgeom.KVGeomError:
        assume(False)
    assert vg.differences(r) == {}
