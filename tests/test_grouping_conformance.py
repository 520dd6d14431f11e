"""Which layer sits in which group, and each layer's block: ``kvgeom.resolve_block_sizes`` against vLLM 0.33's
own ``get_kv_cache_groups`` (``kvgeom.conformance.vllm_grouping``; marked ``vllm``, runs in the vLLM venv).

Rows pin vLLM's membership on the cases that show the rule (a bucket dealt round-robin over its groups,
pipeline stages mixed in one group); the law runs vLLM on generated layered models.
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


_KINDS = ["full_attention", "sliding_window", "chunked_local", "mla", "mamba"]


@st.composite
def layered_models(draw):
    """Layered models of 1-4 entries of the kinds the resolver takes, 1-20 layers each, over 1-2 stages."""
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
            layers.append(_attn(kind, count, heads=draw(st.sampled_from([1, 2])), stage=stage, **extra))
    return {"model": {"block_size": draw(st.sampled_from([16, 64])), "layers": layers}, "parallel": {"pp": pp}}


@settings(max_examples=40, deadline=None)
@given(cfg=layered_models())
def test_group_membership_and_layer_blocks_are_vllms(cfg):
    try:
        r = resolve_block_sizes(cfg)
    except kvgeom.KVGeomError:
        assume(False)
    assert vg.differences(r) == {}
