"""Laws of the four spec kinds of issue 19 (``rswa``, ``hisparse_hot``, ``hisparse_resident``, ``encoder_only``).

Their vLLM rows and the law against vLLM's own coordinator are in ``tests/test_speckinds_vllm.py``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import batch
from kvgeom.hits import rswa_gap_blocks
from kvgeom.keys import key_map
from kvgeom.strategies import configs

_KINDS = ("full_attention", "mla", "mamba", "sliding_window", "rswa", "hisparse_hot", "hisparse_resident",
          "encoder_only")


@st.composite
def rswa_requests(draw):
    block = draw(st.sampled_from([1, 3, 16, 64]))
    dcp = draw(st.sampled_from([1, 2]))
    g = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": block, "rswa_window": draw(st.integers(0, 500))}],
                        "parallel": {"dcp": dcp, "tp": dcp}})
    prompts = draw(st.lists(st.integers(0, 2000), max_size=8))
    computed = [p + draw(st.integers(0, 2000)) for p in prompts]
    return g, prompts, computed


@given(case=rswa_requests())
@example(case=(kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": 16, "rswa_window": 40}]}), [], []))
def test_rswa_gap_never_frees_a_prompt_block_nor_the_window(case):
    g, prompts, computed = case
    S, W = g.groups[0].span, g.groups[0].spec.rswa_window
    start, stop = batch.rswa_gap_blocks(g, 0, np.array(prompts, dtype=np.int64), np.array(computed, dtype=np.int64))
    for i, (P, T) in enumerate(zip(prompts, computed, strict=True)):
        r = rswa_gap_blocks(g, 0, P, T)
        assert (r.start, r.stop) == (start[i], stop[i])  # the batch twin agrees element by element
        for b in r:
            assert b * S >= P  # no block holding a prompt token
            assert (b + 1) * S <= T - W  # nor one holding any of the last W processed tokens
        later = rswa_gap_blocks(g, 0, P, T + S)
        assert set(r) <= set(later)  # what is freed stays freed


def _without(cfg, kinds):
    return {**cfg, "groups": [x for x in cfg["groups"] if x["kind"] not in kinds]}


@given(cfg=configs(kinds=_KINDS, max_dcp=2, max_block_size=64, offload=True))
def test_the_new_kinds_never_reach_the_tier_and_encoder_only_never_moves_l_or_h(cfg):
    g = kvgeom.resolve(cfg)
    for x in g.groups:
        if x.kind in ("hisparse_hot", "hisparse_resident", "encoder_only"):
            assert not x.prefix_cacheable
            assert g.offload is None or x.index not in {o.index for o in g.offload.groups}
    rest = _without(cfg, {"encoder_only"})
    if len(rest["groups"]) < len(cfg["groups"]) and rest["groups"]:
        h = kvgeom.resolve(rest)  # vLLM's scheduler never sees the encoder-only group
        assert (g.scheduler_block_size, g.hash_block_size, g.hit_alignment_tokens) == (
            h.scheduler_block_size, h.hash_block_size, h.hit_alignment_tokens)


@given(cfg=configs(kinds=("full_attention", "rswa", "mamba"), max_dcp=2, max_block_size=64, offload=True),
       n=st.integers(0, 300))
def test_rswa_is_full_attention_for_every_geometry_rule(cfg, n):
    g = kvgeom.resolve(cfg)
    full = {**cfg, "groups": [
        {k: v for k, v in x.items() if k != "rswa_window"} | {"kind": "full_attention"} if x["kind"] == "rswa" else x
        for x in cfg["groups"]]}
    f = kvgeom.resolve(full)
    assert [x.span for x in g.groups] == [x.span for x in f.groups]
    assert (g.scheduler_block_size, g.hash_block_size, g.hit_alignment_tokens, g.partial_hash_hits) == (
        f.scheduler_block_size, f.hash_block_size, f.hit_alignment_tokens, f.partial_hash_hits)
    if g.offload is not None:
        strip = [[{k: v for k, v in x.items() if k != "kind"} for x in key_map(h, n)["groups"]] for h in (g, f)]
        assert strip[0] == strip[1]  # the same keys, group by group (only the kind's name differs)
