"""Prefix-hit law bodies shared by ``test_prefix_laws.py`` and its teeth tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

import kvgeom
from kvgeom._math import cdiv
from kvgeom.geometry import Geometry, SpeculativeGeometry
from kvgeom.prefix import PrefixHit, prefix_hit
from kvgeom.specs import attention_chunk_size_of, sliding_window_of
from kvgeom.speculative import gpu_dropping_groups
from kvgeom.strategies import configs

MAX_BLOCK = 16
MAX_TOKENS = 400
#: Lookups vLLM 0.33 has no answer for (it asserts or raises): the law then checks the error is ours.
UNSUPPORTED = {"cross_attention_prefix_cache", "chunked_local_span_not_alignment", "drop_on_chunked_local"}
KINDS = ["full_attention", "mla", "mamba", "sliding_window", "chunked_local", "uniform", "circular_buffer"]


def with_drop(geom: Geometry, groups: set[int]) -> Geometry:
    """``geom`` with the GPU speculative drop on for ``groups`` (full-attention and sliding-window
    groups only: Mamba never drops, chunked local cannot), margins as vLLM's ``eagle_proof_margin``."""
    H = geom.hash_block_size
    out = []
    for g in geom.groups:
        if g.index in groups and g.prefix_cacheable and g.family in {"full", "sliding"}:
            fine = geom.partial_hash_hits and g.family == "full" and g.span > H
            g = dataclasses.replace(g, eagle_group=True, proof_margin=H if fine else g.span)
        out.append(g)
    spec = SpeculativeGeometry("eagle", 1, True, False, True, 1)
    drop_set = gpu_dropping_groups(out, spec)  # the resolved field resolve() would have decided
    return dataclasses.replace(geom, groups=tuple(out), speculative=spec, gpu_drop_groups=drop_set)


#: Full attention 16 (drafter) + Mamba 16 + sliding window 16 / 33 (drafter), no partial hash hits.
_GEOM_45614 = with_drop(
    kvgeom.resolve(
        {
            "groups": [
                {"kind": "full_attention", "block_size": 16},
                {"kind": "mamba", "block_size": 16},
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 33},
            ]
        }
    ),
    {0, 2},
)
#: Attention lacks 48, so it proves 32 and drops to 16; Mamba has no state at or below 16.
ROW_45614 = (_GEOM_45614, 80, {"0": [16, 32, 64, 80], "1": [32, 48, 64, 80], "2": [16, 32, 48, 64, 80]})



@st.composite
def prefix_cases(
    draw: st.DrawFn, *, drop: bool = False, kinds: list[str] | None = None
) -> tuple[Geometry, int, dict[str, list[int]]]:
    """(geometry with prefix caching, num_tokens, resident): per group a random set of entries on
    the H grid, dense or sparse (holes anywhere), partial entries included."""
    cfg = draw(configs(kinds=kinds or KINDS, max_block_size=MAX_BLOCK, max_dcp=8,
                                         prefix_caching=True, offload=False, max_groups=3))
    geom = kvgeom.resolve(cfg)
    if drop:
        chosen = draw(st.sets(st.sampled_from(range(len(geom.groups)))))
        if draw(st.booleans()):  # a real drafter config, resolved by kvgeom.speculative
            groups = [{**g, "drafter": True} if i in chosen else g for i, g in enumerate(cfg["groups"])]
            spec = {"method": draw(st.sampled_from(["eagle", "eagle3", "mtp"])),
                    "num_speculative_tokens": draw(st.integers(1, 3)), "lookahead_hashes": draw(st.booleans())}
            try:
                geom = kvgeom.resolve({**cfg, "groups": groups, "speculative": spec})
            except kvgeom.KVGeomError:
                geom = with_drop(geom, chosen)
        else:
            geom = with_drop(geom, chosen)
    n = draw(st.integers(0, MAX_TOKENS))
    H = geom.hash_block_size
    grid = list(range(H, n + H, H))
    resident: dict[str, list[int]] = {}
    for g in geom.groups:
        if not g.prefix_cacheable or not grid:
            continue
        density = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
        rnd = draw(st.randoms(use_true_random=False))
        resident[str(g.index)] = [e for e in grid if rnd.random() < (density if e % g.span == 0 else density / 2)]
    return geom, n, resident


def hit_or_unsupported(geom: Geometry, n: int, resident: Any) -> PrefixHit | None:
    try:
        return prefix_hit(geom, n, resident)
    except kvgeom.QueryError as e:
        assert {p.code for p in e.problems} <= UNSUPPORTED, e
        return None


def usable(geom: Geometry, group: int, held: set[int], t: int, limit: int | None = None) -> bool:
    """Whether group ``group`` alone, holding entries ``held``, can serve a hit of ``t`` tokens:
    full attention every span below t and an entry covering t's block; sliding window the blocks of
    the last ``sliding_window - 1`` positions; Mamba the state at t; chunked local the blocks from the
    start of the attention chunk of the lookup's limit (``limit``, default t: vLLM 0.33's
    ``ChunkedLocalAttentionManager`` counts every block before that chunk as reused without reading
    it, so with a chunk smaller than the block a hit below the limit's chunk needs no entry at all)."""
    g = geom.groups[group]
    S = g.span
    if t == 0:
        return True
    match g.family:
        case "mamba":
            return t in held
        case "full":
            if any((j + 1) * S not in held for j in range(t // S)):
                return False
            return t % S == 0 or cdiv(t, S) * S in held or any(t <= e < cdiv(t, S) * S for e in held)
        case "sliding":
            window = sliding_window_of(g.spec)
            assert window is not None
            first = max(t - (window[0] - 1), 0)
            return t % S == 0 and all((b + 1) * S in held for b in range(first // S, t // S))
        case "chunked":
            size = attention_chunk_size_of(g.spec)
            assert size is not None
            top = t if limit is None else max(limit, t)
            return t % S == 0 and all((b + 1) * S in held for b in range(top // size * size // S, t // S))
        case _:
            return True


def held_sets(geom: Geometry, resident: dict[str, list[int]]) -> dict[int, set[int]]:
    return {g.index: set(resident.get(str(g.index), ())) for g in geom.groups}


def check_mamba_state_exact(case: tuple[Geometry, int, dict[str, list[int]]]) -> None:
    """Every align-mode Mamba group restores the state ending at exactly the hit."""
    geom, n, resident = case
    hit = hit_or_unsupported(geom, n, resident)
    if hit is None or hit.hit_tokens == 0:
        return
    held = held_sets(geom, resident)
    for g in geom.groups:
        if g.is_align_mamba and g.prefix_cacheable:
            assert hit.groups[g.index].end_tokens == (hit.hit_tokens,), (g.index, hit)
            assert hit.hit_tokens in held[g.index]
