"""Laws of block-size resolution (docs/resolution.md): the Mamba state fits, pages unify, stages agree."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.pages import attention_page_bytes, mamba_state_bytes
from kvgeom.resolution import resolve_block_sizes


@st.composite
def hybrids(draw):
    latent = draw(st.booleans())
    dtype = draw(st.sampled_from(["bfloat16", "fp8", "float16"]))
    if latent:
        attn = {"kind": "mla", "head_size": draw(st.sampled_from([512, 576])), "dtype": dtype}
    else:
        attn = {
            "kind": "full_attention",
            "num_kv_heads": draw(st.integers(1, 8)),
            "head_size": draw(st.sampled_from([64, 80, 128, 256])),
            "dtype": dtype,
        }
    attn["count"] = draw(st.integers(1, 6))
    attn["pp_stage"] = draw(st.integers(0, 1))
    n_states = draw(st.integers(1, 3))
    shapes = [draw(st.lists(st.integers(1, 96), min_size=1, max_size=3)) for _ in range(n_states)]
    dtypes = [draw(st.sampled_from(["float32", "bfloat16"])) for _ in range(n_states)]
    mamba = {"kind": "mamba", "shapes": shapes, "dtypes": dtypes, "count": draw(st.integers(1, 12))}
    mamba["pp_stage"] = draw(st.integers(0, 1))
    model = {
        "block_size": draw(st.sampled_from([16, 32, 64, 256])),
        "kernel_block_size": draw(st.sampled_from([16, 32, 64])),
        "layers": [attn, mamba],
    }
    return {"model": model, "parallel": {"pp": 2}, "offload": {}}


def _per_token(attn):
    return attention_page_bytes(
        block_size=1,
        num_kv_heads=attn.get("num_kv_heads", 1),
        head_size=attn["head_size"],
        head_size_v=0 if attn["kind"] == "mla" else attn["head_size"],
        dtype=attn["dtype"],
    )


@given(cfg=hybrids())
def test_mamba_state_fits_one_attention_page_and_pages_unify(cfg):
    attn, mamba = cfg["model"]["layers"]
    r = resolve_block_sizes(cfg)
    b = r.attention_block_size
    m = mamba_state_bytes(tuple(map(tuple, mamba["shapes"])), tuple(mamba["dtypes"]))
    assert b * _per_token(attn) >= m  # _align_hybrid_block_size: the attention page holds the Mamba state
    assert b >= cfg["model"]["block_size"]  # raised, never lowered
    assert b % cfg["model"]["kernel_block_size"] == 0
    if attn["kind"] == "mla":
        assert b >= 128  # MLA hybrid minimum
    assert r.mamba_block_size == b  # align mode: B_m = per-rank attention block
    assert r.page_bytes == b * _per_token(attn)  # one page for every layer (unify_kv_cache_spec_page_size)
    assert {g["block_size"] for g in r.config["groups"]} == {b}
    padded = [p for p in r.padding if p.kind == "mamba"]
    assert bool(padded) == (b * _per_token(attn) != m)
    assert all(math.isclose(p.percent, 100 * (r.page_bytes - m) / m) for p in padded)
    g = kvgeom.resolve(r.config)  # the result feeds the rest of kvgeom
    assert all(o.tokens_per_block % g.hash_block_size == 0 for o in g.offload.groups)


@given(cfg=hybrids())
def test_pipeline_stages_never_change_the_block_sizes(cfg):
    # #51752/#51764: alignment happens once for all stages; moving layers between stages changes nothing
    flat = {**cfg, "model": {**cfg["model"], "layers": [{**x, "pp_stage": 0} for x in cfg["model"]["layers"]]}}
    a, b = resolve_block_sizes(cfg), resolve_block_sizes(flat)
    assert a.config["groups"] == b.config["groups"]
    assert (a.attention_block_size, a.mamba_block_size, a.page_bytes) == (
        b.attention_block_size,
        b.mamba_block_size,
        b.page_bytes,
    )


@st.composite
def compressed_hybrids(draw):
    """Hybrids with a second, compressed attention layer (any kind with a block, ``tokens_per_state`` up to
    128 on blocks as small as 1): where a block can hold no state."""
    cfg = draw(hybrids())
    kind = draw(st.sampled_from(["full_attention", "sliding_window", "chunked_local"]))
    layer = {"kind": kind, "num_kv_heads": draw(st.integers(1, 4)), "head_size": 128, "dtype": "bfloat16",
             "tokens_per_state": draw(st.sampled_from([1, 2, 4, 16, 64, 128])), "count": 1}
    if kind == "sliding_window":
        layer["sliding_window"] = draw(st.integers(1, 4096))
    if kind == "chunked_local":
        layer["attention_chunk_size"] = draw(st.integers(1, 4096))
    model = {**cfg["model"], "block_size": draw(st.sampled_from([1, 2, 16, 64])),
             "layers": [*cfg["model"]["layers"], layer]}
    return {**cfg, "model": model}


@given(cfg=compressed_hybrids())
def test_resolution_answers_or_refuses_a_block_that_holds_no_state(cfg):
    # kvgeom 0.3.0.dev0 raised ZeroDivisionError here (a sliding layer's kernel block holding no state)
    try:
        r = resolve_block_sizes(cfg)
    except kvgeom.KVGeomError as e:
        assert all(p.code and p.field for p in e.problems)
        return
    assert r.attention_block_size is not None and r.attention_block_size > 0
