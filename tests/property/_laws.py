"""Law bodies shared by the property tests and the teeth tests.

Each ``check_*`` takes a config dict, resolves it and asserts one invariant of
docs/concepts.md. The expected values come from a small **test oracle** written from
the rules (which kinds are dealt across DCP ranks, how many ranks), never from
the kvgeom function under test, so a seam broken on purpose (``tests/property/
test_teeth_core.py``) makes the law fail instead of agreeing with itself.

The historical configs are the cases of docs/cases/.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import tomllib
from typing import Any

import kvgeom
from kvgeom._math import cdiv

# --------------------------------------------------------------------------- historical rows (docs/cases/)

#: vLLM #49964: attention 16 + Mamba 16 under DCP 2 -> spans (32, 16).
H49964: dict[str, Any] = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"},
    ],
    "parallel": {"tp": 2, "dcp": 2},
    "offload": {},
}

_DSA = {"kind": "uniform", "block_size": 64, "layers": [{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}]}
#: vLLM #50883: DSA wrapper, block 64, DCP 2 -> span 128.
H50883_D2: dict[str, Any] = {"groups": [_DSA], "parallel": {"tp": 2, "dcp": 2}, "offload": {}}
#: vLLM #50883 / #53889 (GLM-5.2, DCP 8) -> span 512.
H50883_D8: dict[str, Any] = {"groups": [_DSA], "parallel": {"tp": 8, "dcp": 8}, "offload": {}}

#: vLLM #50287: max_model_len 512, B = B_m = 16, DCP 2 -> Mamba row 32.
H50287: dict[str, Any] = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"},
    ],
    "parallel": {"tp": 2, "dcp": 2},
    "cache": {"max_model_len": 512},
}

#: LMCache #4809 -> #4834: resolved 2304-token pages under DCP 4 ->
#: attention span 9216, Mamba span 2304, scheduler block / chunk lcm 9216.
LMC4809: dict[str, Any] = {
    "groups": [
        {"kind": "full_attention", "block_size": 2304},
        {"kind": "mamba", "block_size": 2304, "mamba_cache_mode": "align"},
    ],
    "parallel": {"tp": 4, "dcp": 4},
    "offload": {},
}

HISTORICAL = {"49964": H49964, "50883_d2": H50883_D2, "50883_d8": H50883_D8, "50287": H50287, "lmcache_4809": LMC4809}

# --------------------------------------------------------------------------- test oracle (docs/concepts.md)

_ATTENTION_KINDS = frozenset(
    {
        "full_attention",
        "mla",
        "sink_full_attention",
        "sliding_window",
        "sliding_window_mla",
        "chunked_local",
        "cross_attention",
        "circular_buffer",
        # vLLM 0.33 AttentionSpec subclasses (dcp_sharded=True by default, run on vLLM); the HiSparse specs are
        # plain KVCacheSpecs (dcp_sharded=False) and stay out
        "rswa",
        "encoder_only",
    }
)


def oracle_sharded(spec: Any) -> bool:
    """Attention kinds are dealt across DCP ranks, Mamba is replicated, a container as its layers."""
    if spec.dcp_sharded is not None:
        return bool(spec.dcp_sharded)
    if spec.kind == "uniform":
        return oracle_sharded(spec.layers[0])
    return spec.kind in _ATTENTION_KINDS


def oracle_shards(p: kvgeom.ParallelConfig) -> int:
    """DCP ranks; PCP multiplies only in the pre-#46570 design (``pcp_shards_kv``)."""
    return p.dcp * (p.pcp if p.pcp_shards_kv else 1)


def is_mamba_group(spec: Any) -> bool:
    return spec.kind == "mamba" or (spec.kind == "uniform" and spec.layers[0].kind == "mamba")


def _mamba_leaves(spec: Any) -> list[Any]:
    return list(spec.layers) if spec.kind == "uniform" else [spec]


# --------------------------------------------------------------------------- laws


def check_span(cfg: Any) -> None:
    """S_g = block_size * shards for a sharded group, block_size otherwise (docs/concepts.md)."""
    g = kvgeom.resolve(cfg)
    shards = oracle_shards(g.parallel)
    for x in g.groups:
        expected = x.spec.block_size * (shards if oracle_sharded(x.spec) else 1)
        assert x.span == expected, f"group {x.index} ({x.kind}): span {x.span}, expected {expected}"


def check_mamba_span(cfg: Any) -> None:
    """A Mamba group (or a container of Mamba leaves) spans its block size under any DCP (#49964)."""
    g = kvgeom.resolve(cfg)
    for x in g.groups:
        if is_mamba_group(x.spec):
            assert x.span == x.block_size, f"Mamba group {x.index}: span {x.span} != block_size {x.block_size}"
            assert not x.dcp_sharded


def check_pcp_never_scales_span(cfg: Any) -> None:
    """Turning PCP on or off never changes a span unless ``pcp_shards_kv`` (vLLM #46570)."""
    p = dict(cfg.get("parallel", {}))
    if p.get("pcp_shards_kv"):
        return
    base = kvgeom.resolve(cfg)
    dcp = p.get("dcp", 1)
    if p.get("pcp", 1) > 1:
        p.pop("pcp")
        p["tp"] = p.get("tp", 1) * dcp  # without PCP, tp must be a multiple of dcp
    else:
        p["pcp"] = dcp if dcp > 1 else 2  # with PCP, dcp must be 1, pcp or tp*pcp
    other = kvgeom.resolve({**cfg, "parallel": p})
    assert [x.span for x in other.groups] == [x.span for x in base.groups]
    assert other.scheduler_block_size == base.scheduler_block_size


def check_scheduler_block_and_hash_unit(cfg: Any) -> None:
    """L = lcm(spans); every span divides L; H divides L, and every cacheable span whenever something
    consumes hashes (prefix caching or an offloading connector; otherwise H = L, resolve_kv_cache_block_sizes).
    The spans are those of the groups vLLM's scheduler sees: an encoder-only group is not one of them (its
    model runner appends it after the scheduler's config is built), unless nothing else is left."""
    g = kvgeom.resolve(cfg)
    seen = [x for x in g.groups if x.kind != "encoder_only"] or list(g.groups)
    spans = [x.span for x in seen]
    L, H = g.scheduler_block_size, g.hash_block_size
    assert math.lcm(*spans) == L, f"L={L}, lcm of spans {spans} is {math.lcm(*spans)}"
    assert all(L % s == 0 for s in spans)
    assert L % H == 0
    if g.config.cache.prefix_caching or g.offload is not None:
        assert all(x.span % H == 0 for x in g.groups if x.prefix_cacheable)
    else:
        assert H == L


def check_hit_alignment(cfg: Any) -> None:
    """A is H with partial hash hits, else L; A is a multiple of every tokens_per_state > 1."""
    g = kvgeom.resolve(cfg)
    A = g.hit_alignment_tokens
    assert (g.hash_block_size if g.partial_hash_hits else g.scheduler_block_size) == A
    if g.partial_hash_hits:
        assert g.config.cache.prefix_caching and len(g.groups) >= 2
    for x in g.groups:
        for leaf in x.spec.layers if x.spec.kind == "uniform" else [x.spec]:
            tps = getattr(leaf, "tokens_per_state", None)
            if tps is not None and tps > 1:
                assert A % tps == 0


def _scheduler_max_blocks(x: kvgeom.GroupGeometry, max_len: int) -> int:
    """Most block ids the scheduler hands one request of max_len tokens in group x (max_num_blocks_per_req)."""
    if is_mamba_group(x.spec):
        spec_blocks = max(leaf.num_speculative_blocks for leaf in _mamba_leaves(x.spec))
        if x.mamba_mode == "none":
            return 1 + spec_blocks
        return cdiv(max_len, x.span) + spec_blocks
    if x.kind == "circular_buffer":
        return 1
    if x.kind == "hisparse_hot":
        return x.spec.blocks_per_request  # a fixed hot region (vLLM 0.33 HiSparseHotSpec.max_num_blocks_per_req)
    return cdiv(max_len, x.span)


def check_row_width_holds_scheduler_blocks(cfg: Any) -> None:
    """Every block-table row is wide enough for every block the scheduler can allocate (#50287, #50823)."""
    g = kvgeom.resolve(cfg)
    max_len = g.config.cache.max_model_len
    for x in g.groups:
        if max_len is None:
            assert x.row_width is None
            continue
        need = _scheduler_max_blocks(x, max_len)
        assert x.row_width is not None and x.row_width >= need, (
            f"group {x.index} ({x.kind}): row width {x.row_width} < {need} blocks the scheduler can allocate"
        )


def check_mamba_row_width(cfg: Any) -> None:
    """An align-mode Mamba row is cdiv(max_model_len, B_m) + speculative blocks, never divided by DCP."""
    g = kvgeom.resolve(cfg)
    max_len = g.config.cache.max_model_len
    if max_len is None:
        return
    for x in g.groups:
        if is_mamba_group(x.spec) and x.mamba_mode in {"align", "all"}:
            spec_blocks = max(leaf.num_speculative_blocks for leaf in _mamba_leaves(x.spec))
            assert x.row_width == cdiv(max_len, x.block_size) + spec_blocks, (
                f"Mamba group {x.index}: row {x.row_width}, expected cdiv({max_len}, {x.block_size}) + {spec_blocks}"
            )


def check_uniform_span_equals_leaves(cfg: Any) -> None:
    """A uniform container spans exactly what each of its layers would span as its own group (#50883)."""
    g = kvgeom.resolve(cfg)
    for x in g.groups:
        if x.kind != "uniform":
            continue
        for leaf in x.spec.layers:
            groups = list(cfg["groups"])
            groups[x.index] = leaf.model_dump(mode="json", exclude_none=True)
            if x.spec.dcp_sharded is not None:  # an explicit override on the container applies to its layers
                groups[x.index]["dcp_sharded"] = x.spec.dcp_sharded
            alone = kvgeom.resolve({**cfg, "groups": groups})
            assert alone.groups[x.index].span == x.span, (
                f"uniform group {x.index}: span {x.span}, its {leaf.kind} layer alone spans "
                f"{alone.groups[x.index].span}"
            )


def check_offload_geometry(cfg: Any) -> None:
    """tokens_per_block = S_g, tokens_per_chunk = S_g * k, hashes_per_chunk = C_g / H (from_spec)."""
    g = kvgeom.resolve(cfg)
    off = g.offload
    if off is None:
        assert "offload" not in cfg or cfg["offload"] is None
        return
    H, k = g.hash_block_size, off.blocks_per_chunk
    assert off.tokens_per_hash == H
    assert [o.index for o in off.groups] == [x.index for x in g.groups if x.prefix_cacheable]
    oc = cfg["offload"]
    if "block_size" in oc:
        assert all(o.tokens_per_chunk == oc["block_size"] for o in off.groups)
    else:
        assert k == oc.get("blocks_per_chunk", 1)
    for o in off.groups:
        x = g.groups[o.index]
        assert o.tokens_per_block == x.span
        assert o.tokens_per_chunk == x.span * k
        assert o.hashes_per_chunk * H == o.tokens_per_chunk
        if is_mamba_group(x.spec):
            assert o.window_chunks == 1
    mamba = {o.tokens_per_chunk for o in off.groups if g.groups[o.index].mamba_mode in {"align", "all"}}
    assert off.mamba_align_size == (mamba.pop() if mamba else None)


def check_retention(cfg: Any) -> None:
    """R > 0 is a multiple of L and of every windowed offloaded chunk (vLLM 0.33 SchedulerOffloadConfig.from_spec)."""
    g = kvgeom.resolve(cfg)
    R = g.config.cache.retention_interval
    if not R:
        return
    assert any(x.family in {"sliding", "mamba"} for x in g.groups)
    assert R % g.scheduler_block_size == 0
    if g.offload is not None:
        assert g.offload.retention_interval == R
        for o in g.offload.groups:
            if g.groups[o.index].family in {"sliding", "chunked", "mamba"}:
                assert R % o.tokens_per_chunk == 0


def check_interleave_fits_sharded_blocks(cfg: Any) -> None:
    """Under DCP every dealt group's per-rank block is a multiple of the interleave (docs/deviations.md)."""
    g = kvgeom.resolve(cfg)
    if oracle_shards(g.parallel) == 1:
        return
    I = g.parallel.cp_interleave  # noqa: E741 - the reference's name
    for x in g.groups:
        assert x.dcp_sharded == oracle_sharded(x.spec)
        if x.dcp_sharded:
            assert x.block_size % I == 0


def check_roundtrip(cfg: Any) -> None:
    """A config survives dict -> JSON -> config and config -> TOML -> config, as text and as files."""
    model = kvgeom.load_config(cfg)
    as_json = json.dumps(model.to_dict())
    assert kvgeom.load_config(json.loads(as_json)) == model
    as_toml = model.to_toml()
    assert kvgeom.load_config(tomllib.loads(as_toml)) == model
    with tempfile.TemporaryDirectory() as d:
        for name, text in (("c.json", as_json), ("c.toml", as_toml)):
            path = os.path.join(d, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            assert kvgeom.load_config(path) == model
    assert kvgeom.resolve(tomllib.loads(as_toml)).to_report() == kvgeom.resolve(cfg).to_report()
