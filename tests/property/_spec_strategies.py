"""Speculative-decoding geometries for the laws in test_speculative_laws.py (drafter groups, every method,
DCP 1/2/4/8, offload chunks of 1-2 blocks, partial tails)."""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

import kvgeom
from kvgeom.errors import KVGeomError

METHODS = st.sampled_from(["eagle", "eagle3", "mtp", "mtp", "draft_model", "ngram", "dflash"])


@st.composite
def speculative_sections(draw: st.DrawFn, *, block_drop: bool | None = None) -> dict[str, Any]:
    method = draw(METHODS) if block_drop is None else draw(
        st.sampled_from(["eagle", "eagle3", "mtp"]) if block_drop else METHODS
    )
    sec: dict[str, Any] = {"method": method, "num_speculative_tokens": draw(st.integers(1, 4))}
    if block_drop is False or draw(st.integers(0, 4)) == 0:
        sec["eagle_block_drop"] = False
    if draw(st.integers(0, 3)) == 0:
        sec["lookahead_hashes"] = False
    if method == "mtp" and draw(st.booleans()):
        sec["mtp_modules"] = draw(st.integers(1, 3))
    return sec


@st.composite
def speculative_configs(
    draw: st.DrawFn, *, offload: bool | None = None, block_drop: bool | None = None, sliding: bool = True
) -> dict[str, Any]:
    dcp = draw(st.sampled_from([1, 1, 2, 4, 8]))
    kinds = ["full_attention", "mla", "mamba"] + (["sliding_window"] if sliding else [])
    groups: list[dict[str, Any]] = []
    block = draw(st.sampled_from([16, 32]))
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(kinds))
        g: dict[str, Any] = {"kind": kind, "block_size": draw(st.sampled_from([block, block, 2 * block]))}
        if kind == "sliding_window":
            g["sliding_window"] = draw(st.integers(1, 80))
            if dcp > 1:
                g["dcp_sharded"] = False
        groups.append(g)
    if draw(st.booleans()):
        groups.append({"kind": "mamba", "block_size": draw(st.sampled_from([block, 2 * block]))})
    # the drafter: flag an existing attention group, add one (own spec), or none (the fallbacks)
    attn = [i for i, g in enumerate(groups) if g["kind"] != "mamba"]
    choice = draw(st.sampled_from(["flag", "add", "add", "none"]))
    if choice == "flag" and attn:
        groups[draw(st.sampled_from(attn))]["drafter"] = True
    elif choice == "add" or not attn:
        d: dict[str, Any] = {"kind": "full_attention", "block_size": block, "drafter": True, "num_kv_heads": 4}
        if sliding and draw(st.integers(0, 5)) == 0:
            d = {"kind": "sliding_window", "block_size": block, "sliding_window": draw(st.integers(1, 64)),
                 "drafter": True, "dcp_sharded": False}
        groups.append(d)
    cfg: dict[str, Any] = {"groups": groups, "parallel": {"tp": dcp, "dcp": dcp},
                           "speculative": draw(speculative_sections(block_drop=block_drop))}
    if offload if offload is not None else draw(st.booleans()):
        cfg["offload"] = {"blocks_per_chunk": draw(st.sampled_from([1, 1, 2]))}
    cache: dict[str, Any] = {"retention_interval": draw(st.sampled_from([0, 0, None]))}
    if draw(st.booleans()):
        cache["prefix_match_unit"] = draw(st.sampled_from([8, 16]))
    cfg["cache"] = cache
    return cfg


@st.composite
def speculative_geometries(draw: st.DrawFn, **kwargs: Any) -> kvgeom.Geometry:
    cfg = draw(speculative_configs(**kwargs))
    try:
        return kvgeom.resolve(cfg)
    except KVGeomError:
        assume(False)
        raise


@st.composite
def tail_speculative_geometries(draw: st.DrawFn) -> kvgeom.Geometry:
    """Partial tails with an eagle attention group: one span, k = 1, align Mamba, H < span, DCP 1."""
    block = draw(st.sampled_from([16, 32, 64]))
    cfg = {
        "groups": [{"kind": draw(st.sampled_from(["full_attention", "mla"])), "block_size": block, "drafter": True},
                   {"kind": "mamba", "block_size": block}],
        "cache": {"prefix_match_unit": draw(st.sampled_from([4, 8, block // 2])),
                  "retention_interval": draw(st.sampled_from([None, 0, block]))},
        "offload": {},
        "speculative": {"method": draw(st.sampled_from(["eagle", "eagle3", "mtp"])), "num_speculative_tokens": 2},
    }
    geom = kvgeom.resolve(cfg)
    assert geom.offload is not None and geom.offload.supports_partial_tail
    return geom


@st.composite
def eagle_window_geometries(draw: st.DrawFn) -> kvgeom.Geometry:
    """A sliding-window eagle drafter (window 1-100, block 16 or 32), with or without full attention, an align
    Mamba group and a second (target) window; k = 1 or 2, DCP 1: the geometries of vLLM 0.33's widened
    ``_sliding_window_lookup`` (issue 19's pair-scan sweep)."""
    block = draw(st.sampled_from([16, 32]))
    groups: list[dict[str, Any]] = [{"kind": "sliding_window", "block_size": block,
                                     "sliding_window": draw(st.integers(1, 100)), "drafter": True}]
    if draw(st.booleans()):
        groups.append({"kind": "full_attention", "block_size": draw(st.sampled_from([16, 32]))})
    if draw(st.booleans()):
        groups.append({"kind": "mamba", "block_size": draw(st.sampled_from([16, 32]))})
    if draw(st.integers(0, 3)) == 0:
        groups.append({"kind": "sliding_window", "block_size": block, "sliding_window": draw(st.integers(1, 80))})
    cfg = {"groups": draw(st.permutations(groups)), "cache": {"retention_interval": None},
           "offload": {"blocks_per_chunk": draw(st.sampled_from([1, 2]))},
           "speculative": {"method": draw(st.sampled_from(["eagle", "eagle3", "mtp"])),
                           "num_speculative_tokens": draw(st.integers(1, 3))}}
    try:
        return kvgeom.resolve(cfg)
    except KVGeomError:
        assume(False)
        raise
