"""Laws of the GPU prefix-cache hit (``kvgeom.prefix``) and of the request admission
(``kvgeom.request.plan_request``), the latter checked with the token-accurate simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
from _prefix_laws import (
    MAX_TOKENS,
    ROW_45614,
    check_mamba_state_exact,
    held_sets,
    hit_or_unsupported,
    prefix_cases,
    usable,
    with_drop,
)
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom._math import cdiv
from kvgeom.batch.prefix import prefix_hits
from kvgeom.sim import run_request
from kvgeom.strategies import configs

_H49964 = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # full attention span 32 + Mamba 16, H = A = 16
#: vLLM #46453's shape: full attention 16 + Mamba 16; Mamba holds m0 -- -- m3, attention f0 f1 -- --.
_FA16_M16 = kvgeom.resolve(
    {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]}
)
_46453 = (_FA16_M16, 70, {"0": [16, 32], "1": [16, 64]})


# Found by the `thorough` profile (2026-12-02): a chunked-local group of block 9 with attention chunk 2 and
# nothing cached hits 9 of 11 tokens, as vLLM 0.33 does (run with kvgeom.conformance.vllm_prefix): the block
# below the chunk of the limit (10) is counted without being read. The law had tested t's own chunk.
_CHUNK_BELOW_BLOCK = (
    kvgeom.resolve({"groups": [{"kind": "chunked_local", "block_size": 9, "attention_chunk_size": 2}],
                    "cache": {"max_model_len": 9}}), 11, {"0": []})


@example(case=_46453)  # #46453: hit 16 (m0), not 32 (no m1) and not 64 (no f2, f3)
@example(case=_CHUNK_BELOW_BLOCK)
@given(prefix_cases())
def test_prefix_hit_never_exceeds_any_groups_usable_prefix(case):
    """The hit is below num_tokens, on A, and every prefix-cacheable group alone can serve it (a
    chunked-local group from the attention chunk of the lookup's limit, at most n - 1); full-attention
    groups reuse exactly cdiv(hit, S) resident entries."""
    geom, n, resident = case
    hit = hit_or_unsupported(geom, n, resident)
    if hit is None:
        return
    h = hit.hit_tokens
    assert 0 <= h <= max(n - 1, 0)
    assert h % geom.hit_alignment_tokens == 0 or len(geom.groups) == 1
    held = held_sets(geom, resident)
    for g in geom.groups:
        if g.prefix_cacheable and h:
            assert usable(geom, g.index, held[g.index], h, limit=max(n - 1, 0)), (g.index, h, hit)
        assert set(hit.groups[g.index].end_tokens) <= held[g.index]
        if g.family == "full" and g.prefix_cacheable:
            assert len(hit.groups[g.index].end_tokens) == cdiv(h, g.span)


@example(case=_46453, pick=1, unit=1)  # #46453 with m1 back: Mamba m0 m1 -- m3, hit 16 -> 32
@given(prefix_cases(), st.integers(0, 7), st.integers(1, MAX_TOKENS))
def test_adding_a_resident_entry_never_lowers_the_hit(case, pick, unit):
    geom, n, resident = case
    before = hit_or_unsupported(geom, n, resident)
    cacheable = [x.index for x in geom.groups if x.prefix_cacheable]
    if before is None or n < geom.hash_block_size or not cacheable:
        return
    g = cacheable[pick % len(cacheable)]
    e = (unit % (n // geom.hash_block_size) + 1) * geom.hash_block_size
    more = {**resident, str(g): sorted(set(resident.get(str(g), [])) | {e})}
    after = hit_or_unsupported(geom, n, more)
    assert after is not None and after.hit_tokens >= before.hit_tokens, (g, e, before, after)


@example(case=_46453, pick=0)  # attention f0 gone: hit 0
@given(prefix_cases(), st.integers(0, 1000))
def test_removing_a_resident_entry_never_raises_the_hit(case, pick):
    geom, n, resident = case
    before = hit_or_unsupported(geom, n, resident)
    entries = [(k, e) for k, ends in resident.items() for e in ends]
    if before is None or not entries:
        return
    k, e = entries[pick % len(entries)]
    fewer = {**resident, k: [x for x in resident[k] if x != e]}
    after = hit_or_unsupported(geom, n, fewer)
    assert after is not None and after.hit_tokens <= before.hit_tokens, (k, e, before, after)


@example(case=_46453)
@given(prefix_cases())
def test_restored_mamba_state_is_exact(case):
    check_mamba_state_exact(case)


@example(case=ROW_45614)  # #45614 shape: full attention proves 32, drops to 16; no Mamba state <= 16: hit 0
@given(prefix_cases(drop=True))
def test_restored_mamba_state_is_exact_with_the_drop(case):
    check_mamba_state_exact(case)


@given(prefix_cases(drop=True, kinds=["full_attention", "mla", "mamba", "sliding_window", "uniform"]))
def test_with_the_drop_a_hit_never_includes_the_volatile_unit(case):
    """A dropping group's entries prove at least one drop unit past the hit (full attention
    ``min(A, S)``, sliding window one block): the unit a drafter rewrote is never reused."""
    geom, n, resident = case
    hit = hit_or_unsupported(geom, n, resident)
    if hit is None or hit.hit_tokens == 0:
        return
    h, A = hit.hit_tokens, geom.hit_alignment_tokens
    held = held_sets(geom, resident)
    for g in geom.groups:
        if g.proof_margin is None:
            continue
        unit = min(A, g.span) if g.family == "full" else g.span
        same_block = [e for e in held[g.index] if cdiv(e, g.span) == cdiv(h + unit, g.span)]
        assert usable(geom, g.index, held[g.index], h + unit) or (
            g.family == "full" and any(h + unit <= e for e in same_block)
        ), (g.index, h, unit, hit)


@given(prefix_cases())
def test_probe_and_mapping_residencies_give_the_same_hit(case):
    """The two residency forms (a mapping, a ``contains`` probe such as ``Residency.probe``) give
    the same hit."""
    geom, n, resident = case
    a = hit_or_unsupported(geom, n, resident)
    if a is None:
        return
    r = kvgeom.Residency()
    chain = [f"h{i}" for i in range(n // geom.hash_block_size)]
    for k, ends in resident.items():
        for e in ends:
            if e // geom.hash_block_size <= len(chain):  # past the chain: never held, either way
                r.add(int(k), chain[e // geom.hash_block_size - 1])
    assert kvgeom.prefix_hit(geom, n, r.probe(geom, chain)) == a


@st.composite
def _request_cases(draw):
    cfg = draw(configs(kinds=["full_attention", "mla", "mamba", "uniform"], max_block_size=8,
                                         max_dcp=4, prefix_caching=True, offload=True, max_groups=3,
                                         allow_pcp=False))
    n = draw(st.integers(1, MAX_TOKENS))
    first = draw(st.integers(1, MAX_TOKENS))
    evict_gpu = draw(st.lists(st.booleans(), max_size=120))
    evict_tier = draw(st.lists(st.booleans(), max_size=120))
    return cfg, n, first, evict_gpu, evict_tier


@st.composite
def _dcp_hybrid_cases(draw):
    """Attention + Mamba with equal blocks under DCP: partial hash hits (A = H < L), so GPU hits land
    off the scheduler block and the Scheduler's rounding rule decides."""
    b = draw(st.sampled_from([2, 4, 8]))
    dcp = draw(st.sampled_from([2, 4]))
    cfg = {
        "groups": [{"kind": "full_attention", "block_size": b}, {"kind": "mamba", "block_size": b}],
        "parallel": {"dcp": dcp, "tp": dcp},
        "cache": {"retention_interval": draw(st.sampled_from([None, 0]))},
        "offload": {},
    }
    first = draw(st.integers(1, 200))
    n = max(first + draw(st.integers(-8, 64)), 1)  # the same prompt again, or a longer turn
    # GPU: one group loses every entry past a cut (per-group eviction from the tail, as LRU leaves it)
    evict_gpu = (draw(st.sampled_from([0, 1])), draw(st.integers(0, first)))
    evict_tier = draw(st.lists(st.sampled_from([False, False, False, True]), max_size=120)
                      | st.tuples(st.sampled_from([0, 1]), st.integers(0, first)))
    return cfg, n, first, evict_gpu, evict_tier


_DENSE_49964 = {**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}}


#: GPU entries (group, end) in order: attention 32, 64, 96; Mamba 16 .. 96. Evict Mamba 64, 80, 96.
_GPU_HIT_48 = [False] * 6 + [True] * 3


@example(case=(_DENSE_49964, 100, 100, _GPU_HIT_48, []))  # GPU hit 48 (off L = 32): the load to 96 drops its tail
@example(case=(_DENSE_49964, 100, 100, _GPU_HIT_48, _GPU_HIT_48))  # the tier's hit ends at 48 too: keep 48, no load
@given(_request_cases() | _dcp_hybrid_cases())
def test_plan_request_agrees_with_the_simulator(case):
    """A request admitted by ``plan_request`` resumes correctly in the simulator: the GPU entries it
    adopts hold every position its groups need (and the exact Mamba state when nothing is loaded),
    the load restores exactly ``local + external`` tokens, and no load runs when external is 0."""
    cfg, n, first, evict_gpu, evict_tier = case
    geom = kvgeom.resolve(cfg)
    if isinstance(evict_gpu, tuple):  # (group, cut): the group loses every entry past the cut
        group, cut = evict_gpu
        evict_gpu = lambda g, e: g == group and e > cut  # noqa: E731
    if isinstance(evict_tier, tuple):
        tgroup, tcut = evict_tier
        evict_tier = lambda g, e: g == tgroup and e > tcut  # noqa: E731
    report = run_request(geom, n, first_tokens=first, evict_gpu=evict_gpu, evict_tier=evict_tier)
    assert report.ok, (report.local_problems, report.tier_problems, report.restore_problems)
    plan = report.plan
    assert plan.local_hit_tokens + plan.external_hit_tokens <= n
    if plan.external_hit_tokens == 0:
        assert all(not g.load_keys for g in plan.groups)
    else:
        assert plan.local_hit_tokens % geom.scheduler_block_size == 0
        assert plan.local_hit_tokens + plan.external_hit_tokens > plan.local.hit_tokens


def test_with_drop_gives_attention_a_margin_and_mamba_none():
    g = with_drop(_H49964, {0, 1})
    assert [x.proof_margin for x in g.groups] == [16, None]
    assert dataclasses.replace(g, speculative=None).groups == g.groups


def _matrices(geom, rows):
    """Per group the (R, hashes) bool matrix of a list of (num_tokens, resident) rows."""
    H = geom.hash_block_size
    cols = max((n // H for n, _ in rows), default=0)
    out = {}
    for g in geom.groups:
        if not g.prefix_cacheable:
            continue
        m = np.zeros((len(rows), cols), bool)
        for r, (_n, resident) in enumerate(rows):
            for e in resident.get(str(g.index), ()):
                if e // H <= cols:
                    m[r, e // H - 1] = True
        out[g.index] = m
    return out


def _thinned(resident, rnd):
    return {k: [e for e in v if rnd.random() < 0.7] for k, v in resident.items()}


@given(prefix_cases(), st.lists(st.tuples(st.integers(0, MAX_TOKENS), st.randoms(use_true_random=False)), max_size=5))
def test_batch_prefix_hits_equal_scalar(case, more):
    """``kvgeom.batch.prefix.prefix_hits`` equals ``prefix_hit`` row by row: rows of different
    lengths and residencies (replicas) over one geometry."""
    geom, n0, resident = case
    rows = [(n0, resident)] + [(n, _thinned(resident, rnd)) for n, rnd in more]
    want = []
    for n, res in rows:
        hit = hit_or_unsupported(geom, n, res)
        if hit is None:
            return
        want.append(hit.hit_tokens)
    got = prefix_hits(geom, np.array([r[0] for r in rows], dtype=np.int64), _matrices(geom, rows))
    assert got.dtype == np.int64 and got.tolist() == want


@given(prefix_cases())
def test_batch_prefix_hits_of_an_empty_batch_are_empty(case):
    geom, _n, _resident = case
    if hit_or_unsupported(geom, 0, {}) is None:
        return
    empty = {g.index: np.zeros((0, 0), bool) for g in geom.groups if g.prefix_cacheable}
    assert prefix_hits(geom, np.zeros(0, np.int64), empty).shape == (0,)
    assert prefix_hits(geom, 100, {}).shape == (0,)


@given(prefix_cases(drop=True), st.lists(st.integers(0, MAX_TOKENS), max_size=4))
def test_batch_prefix_hits_equal_scalar_with_the_drop(case, more):
    geom, n0, resident = case
    rows = [(n0, resident)] + [(n, resident) for n in more]
    want = []
    for n, res in rows:
        hit = hit_or_unsupported(geom, n, res)
        if hit is None:
            return
        want.append(hit.hit_tokens)
    got = prefix_hits(geom, np.array([r[0] for r in rows], dtype=np.int64), _matrices(geom, rows))
    assert got.tolist() == want
