"""Edge rows for the batch hit paths (kvgeom/batch/hits.py, lookup.py, probes.py), issue 19.

The oracle of every agreement row is the scalar rule on the same inputs: ``lookup_hits(...).hit(i) ==
lookup_hit(...)``, ``plan_loads(...).plan(i) == plan_load(...)``, ``plan_stores(...).plan(i) == plan_store(...)``,
``lookup_resident(...).hit(i) == lookup_hit(..., stored=residency, block_hashes=chain)``. The inputs are fixed
(seeded), chosen next to the edges the rules branch on: request ends on and next to chunk ends, local
prefixes, prompts shorter than the request, the ``max_load_tokens`` / ``max_num_new_tokens`` clamps, held
runs with holes, windowed groups (sliding, chunked local, Mamba), eagle groups, partial tails. The refusal
rows pin the code, field and numbers of each batch input check.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import kvgeom
from kvgeom import batch, hits
from kvgeom._math import INT64_MAX
from kvgeom.batch.lookup import RequestChains, lookup_resident
from kvgeom.batch.probes import HeldMatrix, eagle_pair_held, stored_matrices
from kvgeom.prefill import prefill_chunk_ends

FA16 = {"kind": "full_attention", "block_size": 16}

# One geometry per rule family the batch lookup branches on (name: config).
CONFIGS = {
    # #49964: FA 16 + Mamba align 16, DCP 2 (span 32): a full-attention prefix, then the Mamba scan
    "default": kvgeom.DEFAULT_CONFIG,
    # sliding window of 33 tokens: a run needs max(cdiv(33 + pad, 16), window chunks)
    "sliding": {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}],
                "offload": {}},
    # a wider sliding window, two blocks per chunk, extra retained tokens
    "sliding_k2": {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 70,
                                     "extra_retained_tokens": 2}], "offload": {"blocks_per_chunk": 2}},
    # chunked local attention: a fixed window of chunks
    "chunked": {"groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}],
                "offload": {}},
    # Mamba alone (windowed only: M = realign(M - 1))
    "mamba": {"groups": [{"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}], "offload": {}},
    # two windowed groups of different widths (the fixed point over the widest first)
    "two_windows": {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 20},
                               {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "align"}], "offload": {}},
    # partial tails: one span 64, H = 16, k = 1, align Mamba
    "tail": {"groups": [{"kind": "full_attention", "block_size": 64},
                        {"kind": "mamba", "block_size": 64, "mamba_cache_mode": "align"}],
             "cache": {"prefix_match_unit": 16}, "offload": {}},
    # eagle: a full-attention drafter group (pops one chunk) next to a Mamba group
    "eagle": {"groups": [FA16, {"kind": "mamba", "block_size": 16},
                         {"kind": "full_attention", "block_size": 16, "drafter": True, "num_kv_heads": 4}],
              "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # eagle sliding drafter: a windowed eagle group (pair-held chunks)
    "eagle_sliding": {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40,
                                        "drafter": True}],
                      "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # partial tails with an eagle attention group (its boundary key sits a proof margin further)
    "eagle_tail": {"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                              {"kind": "mamba", "block_size": 32}],
                   "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {},
                   "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # MLA with DCP 4 and two blocks per chunk, legacy positional Mamba
    "mla_dcp": {"groups": [{"kind": "mla", "block_size": 16}, {"kind": "mamba", "block_size": 64,
                                                               "mamba_cache_mode": "all"}],
                "parallel": {"tp": 4, "dcp": 4}, "offload": {"blocks_per_chunk": 2}},
    # no retention: the finished sliding-window store reconsiders its last alignment segment (k = 2)
    "sliding_revisit": {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 24}],
                        "cache": {"retention_interval": None}, "offload": {"blocks_per_chunk": 2}},
    # the same with the sliding chunk (16) half the alignment (32): the last partial alignment segment
    "sliding_revisit_odd": {"groups": [{"kind": "full_attention", "block_size": 32},
                                       {"kind": "sliding_window", "block_size": 16, "sliding_window": 24}],
                            "cache": {"retention_interval": None, "prefix_match_unit": 16}, "offload": {}},
    # no retention, align Mamba: the states the GPU manager hands off inside the prompt
    "mamba_handoff": {**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}},
}
GEOMS = {name: kvgeom.resolve(cfg) for name, cfg in CONFIGS.items()}

_ORACLE: dict[tuple[object, ...], object] = {}


def scalar(key, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, the scalar oracle of one row, memoised by ``key`` while no scalar code can
    differ between calls: when a mutation run switches on a mutant of ``kvgeom.batch`` only (MUTANT_UNDER_TEST, see
    scripts/mutation-fast.py), the scalar answers are those of the clean run, so the rows that compare the
    batch with them stay fast; any other mutant (a scalar rule's) recomputes every answer."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if mutant and not mutant.startswith("kvgeom.batch."):
        return fn(*args, **kwargs)
    if key not in _ORACLE:
        _ORACLE[key] = fn(*args, **kwargs)
    return _ORACLE[key]


def _lookup_case(geom, seed, size=10):
    """Fixed request rows next to chunk ends, and held matrices with holes (one seed per row set). Seed 3:
    matrices shorter than the requests (keys past a matrix read as not held); seed 4: requests of ~40 chunks
    with long held prefixes (the prefix scan past its first window)."""
    rng = np.random.default_rng(seed)
    H = geom.hash_block_size
    C = max(og.tokens_per_chunk for og in geom.offload.groups)
    chunks = 40 if seed == 4 else 6
    top = chunks * C + 3 * H
    n = [int(max(rng.integers(0, chunks + 1) * C + rng.integers(-2, 3) * (1 if seed % 2 else H // 2), 0))
         for _ in range(size)]
    n[0], n[1] = top, 0
    local = [int(rng.integers(0, x + 1)) if rng.random() < 0.3 else 0 for x in n]
    prompt = [int(rng.integers(0, x + 1)) if rng.random() < 0.3 else x for x in n]
    width = (top // H // 2) | 1 if seed == 3 else top // H + 2  # seed 3: odd, not a whole chunk
    stored = {}
    for og in geom.offload.groups:
        density = rng.choice([0.0, 0.5, 0.85, 1.0] if seed != 4 else [0.0, 0.95], size=(size, 1))
        prefix = rng.integers(width // 2 if seed == 4 else 0, width + 1, size=(size, 1))
        stored[og.index] = (np.arange(width)[None, :] < prefix) | (rng.random((size, width)) < density)
    return n, local, prompt, stored


# (max_load_tokens, max_num_new_tokens) per seed: none, then clamps below, on and far above the requests
CLAMPS = {1: [(None, None), (40, None), (INT64_MAX, INT64_MAX)], 2: [(None, None), (None, 24), (0, None)],
          3: [(None, None), (None, 0), (70, 100)], 4: [(None, None), (700, None)]}


def _hit_and_load(geom, n, **kwargs):
    hit = hits.lookup_hit(geom, n, **kwargs)
    return hit, hits.plan_load(geom, hit)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_lookup_hits_and_load_plans_equal_the_scalar(name, seed):
    """The batch lookup (every step of lookup_hit: minus one, Mamba rounding, clamps, prefix, windowed scans,
    eagle pop, partial tails) and its load plans equal the scalar answers row by row, under each clamp."""
    geom = GEOMS[name]
    H = geom.hash_block_size
    n, local, prompt, stored = _lookup_case(geom, seed)
    for mlt, mnn in CLAMPS[seed]:
        h = batch.lookup_hits(geom, n, stored=stored, num_prompt_tokens=prompt, local_computed_tokens=local,
                              max_load_tokens=mlt, max_num_new_tokens=mnn)
        lp = batch.plan_loads(geom, h)
        assert len(h) == len(lp) == len(n)
        for i in range(len(n)):
            held = {g: [(c + 1) * H for c in np.flatnonzero(m[i])] for g, m in stored.items()}
            want, load = scalar(("lookup", name, seed, mlt, mnn, i), _hit_and_load,
                geom, n[i], stored=held, num_prompt_tokens=prompt[i], local_computed_tokens=local[i],
                max_load_tokens=mlt, max_num_new_tokens=mnn)
            assert h.hit(i) == want, (i, n[i], local[i], prompt[i])
            assert lp.plan(i) == load, i


@pytest.mark.parametrize(
    "name, n, mnn, held, end",
    [
        # max_num_new_tokens puts the candidate inside a chunk (M = 35 - 1 = 34): a chunked-local group needs
        # its fixed window of chunks there, not a window padded to the chunk grid
        ("chunked", 54, 35, [1, 2, 6, 9, 10, 12, 13, 14, 15, 16], 34),
        # a sliding window of 33 tokens at a candidate 1 token past a chunk end (49): max(cdiv(32 + 15, 16), 3)
        # = 3 chunks (the hit at 49 is kept)
        ("sliding", 68, 50, [1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 14, 16], 49),
        # sliding window 70 + 2 retained, C = 32: at 104 the run needs cdiv(71 + 24, 32) = 3 chunks
        ("sliding_k2", 166, 105, [0, 3, 5, 6, 7, 9, 11, 13, 14, 16], 104),
        # at 164 (28 tokens short of a chunk end) it needs cdiv(71 + 28, 32) = 4 chunks, more than the
        # window's 3: the 3 held chunks below 164 are not enough, the scan falls back to 64
        ("sliding_k2", 194, 165, [0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 14, 15, 16], 64),
    ],
)
def test_a_candidate_inside_a_chunk_needs_the_window_padded_to_the_chunk_grid(name, n, mnn, held, end):
    """The run a windowed hit ending at ``at`` needs: max(cdiv(w + (-at) % C, C), window chunks) for a sliding
    window, the fixed window for chunked local attention (kvgeom.hits._scan_window)."""
    geom = GEOMS[name]
    H = geom.hash_block_size
    m = np.zeros((1, 17), dtype=bool)
    m[0, held] = True
    h = batch.lookup_hits(geom, [n], stored={0: np.ones((1, 17), dtype=bool), 1: m}, max_num_new_tokens=mnn)
    assert h.end_token.tolist() == [end]
    assert h.hit(0) == hits.lookup_hit(geom, n, stored={0: [H * (j + 1) for j in range(17)],
                                                        1: [H * (j + 1) for j in held]}, max_num_new_tokens=mnn)


def test_a_matrix_ending_inside_a_chunk_holds_no_part_chunk():
    """sliding_k2 (C = 32, 2 hashes per chunk): a 9-column matrix holds chunks 0..3 (columns 1, 3, 5, 7);
    column 8 is half of chunk 4, which is not held. A long request's scan jumps to chunk 4's start (128)
    and finds the 3-chunk run below it: the hit ends at 128, on the chunk grid."""
    geom = GEOMS["sliding_k2"]
    h = batch.lookup_hits(geom, [400], stored={0: np.ones((1, 30), dtype=bool), 1: np.ones((1, 9), dtype=bool)})
    assert h.end_token.tolist() == [128]
    assert h.hit(0) == hits.lookup_hit(geom, 400, stored={0: list(range(16, 481, 16)), 1: list(range(16, 145, 16))})


def test_a_batch_of_many_long_prefixes_equals_the_scalar():
    """1100 requests whose held prefixes (4100 chunks) run far past the prefix scan's first window: the later
    windows share a budget of 2^22 cells between the active requests, 2^22 // 1100 = 3813 chunks each (an
    integer width); every row equals the scalar."""
    geom = GEOMS["sliding"]  # C = H = 16
    rows, width, stop = 1100, 4200, 4100
    held = np.ones((rows, width), dtype=bool)
    held[:, stop] = False
    h = batch.lookup_hits(geom, [width * 16] * rows, stored={0: held, 1: held})
    ends = [16 * (j + 1) for j in range(width) if j != stop]
    want = hits.lookup_hit(geom, width * 16, stored={0: ends, 1: ends})
    assert want.end_token == stop * 16
    assert {h.hit(i) for i in range(rows)} == {want}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("tracked", [True, False])
def test_lookup_resident_equals_the_scalar_over_the_same_residency(name, tracked):
    """lookup_resident over a Residency (chains kept by RequestChains, or given as lists) == lookup_hit with
    that Residency and each request's hash chain; a key past a request's chain is never read."""
    geom = GEOMS[name]
    H = geom.hash_block_size
    n, local, prompt, stored = _lookup_case(geom, 7 if tracked else 8)
    res = kvgeom.Residency()
    chains = RequestChains(res)
    per_req = []
    for i, x in enumerate(n):
        chain = [b"r%d-%d" % (i % 3, j) for j in range(x // H)]  # requests 0 and 3 share hashes
        per_req.append(chain)
        for g, m in stored.items():
            for col in np.flatnonzero(m[i][: len(chain)]):
                res.add(g, chain[col])
        chains.update(i, chain)
    source = chains.rows(list(range(len(n)))) if tracked else per_req
    for mlt, mnn in [(None, None), (50, None), (None, 20)]:
        got = lookup_resident(geom, res, source, n, num_prompt_tokens=prompt, local_computed_tokens=local,
                              max_load_tokens=mlt, max_num_new_tokens=mnn)
        for i in range(len(n)):
            want = scalar(("resident", name, tracked, mlt, mnn, i), hits.lookup_hit,
                geom, n[i], stored=res, block_hashes=per_req[i], num_prompt_tokens=prompt[i],
                local_computed_tokens=local[i], max_load_tokens=mlt, max_num_new_tokens=mnn)
            assert got.hit(i) == want, (i, n[i])


def _store_case(geom, seed, size=8):
    rng = np.random.default_rng(seed)
    C = max(og.tokens_per_chunk for og in geom.offload.groups)
    n = [int(max(rng.integers(0, 7) * C + rng.integers(-2, 3), 0)) for _ in range(size)]
    n[0] = 0
    computed = [x if rng.random() < 0.6 else int(rng.integers(0, 7 * C)) for x in n]
    prompt = [int(rng.integers(0, x + 1)) if rng.random() < 0.5 else x for x in n]
    # chunks already stored: a few, or up to the request's last chunks (a finished request revisits them)
    stored = {og.index: [int(rng.integers(0, 4)) if rng.random() < 0.5
                         else max(x // og.tokens_per_chunk - int(rng.integers(-1, 3)), 0) for x in n]
              for og in geom.offload.groups if rng.random() < 0.7}
    alloc = None
    if seed % 3 == 0:
        alloc = {og.index: [int(rng.integers(0, 7 * C // og.tokens_per_block + 2)) for _ in n]
                 for og in geom.offload.groups}
    reach = None
    if seed % 2:
        reach = [[int(max(rng.integers(0, 7) * C + rng.integers(-1, 2), 0)) if rng.random() < 0.7 else -1
                  for _ in range(3)] for _ in n]
    fin = [bool(rng.random() < 0.4) for _ in n]
    return n, computed, prompt, stored, alloc, reach, fin


def _chunk_ends(geom, prompt, budget):
    """The first prefill chunk ends of a prompt: the scheduler's (align Mamba), else every ``budget`` tokens."""
    try:
        return list(prefill_chunk_ends(geom, prompt, max_num_batched_tokens=budget))[:4]
    except kvgeom.QueryError:
        return [*range(budget, min(prompt, 3 * budget) + 1, budget), prompt]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed, opo, mot", [(1, True, None), (2, False, None), (3, True, 50), (4, False, 75),
                                            (5, True, None), (6, False, None)])
def test_plan_stores_equal_the_scalar(name, seed, opo, mot):
    """plan_stores (offloadable clamps, finished requests, eagle hold-back, allocated blocks, stored chunks,
    masks over reachable boundaries, Mamba hand-offs, partial tails) equals plan_store row by row. Seeds 5
    and 6 add the prefill chunk ends (align Mamba hand-offs) and requests loaded from the offload tier;
    seed 6 leaves num_prompt_tokens out (the prompt is the request)."""
    geom = GEOMS[name]
    n, computed, prompt, stored, alloc, reach, fin = _store_case(geom, seed)
    ends = loaded = None
    if seed >= 5:
        if seed == 6:
            prompt = n
        ends = [_chunk_ends(geom, p, 24 + 8 * i) for i, p in enumerate(prompt)]
        ends = [e + [-1] * (4 - len(e)) for e in ends]
        loaded = [i % 3 == 1 for i in range(len(n))]
    sp = batch.plan_stores(
        geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=None if seed == 6 else prompt,
        stored_chunks=stored, allocated_blocks=alloc,
        reachable=None if reach is None else np.array(reach, dtype=np.int64),
        offload_prompt_only=opo, max_offload_tokens=mot, finished=np.array(fin),
        chunk_ends=None if ends is None else np.array(ends, dtype=np.int64),
        loaded_from_offload=False if loaded is None else np.array(loaded),
    )
    assert len(sp) == len(n)
    for i in range(len(n)):
        want = scalar(("store", name, seed, i), hits.plan_store,
            geom, num_tokens=n[i], num_computed_tokens=computed[i], num_prompt_tokens=prompt[i],
            stored_chunks={g: v[i] for g, v in stored.items()},
            allocated_blocks=None if alloc is None else {g: v[i] for g, v in alloc.items()},
            reachable=None if reach is None else tuple(t for t in reach[i] if t >= 0),
            offload_prompt_only=opo, max_offload_tokens=mot, finished=fin[i],
            chunk_ends=None if ends is None else [e for e in ends[i] if e >= 0],
            loaded_from_offload=False if loaded is None else loaded[i],
        )
        assert sp.plan(i) == want, (i, n[i], computed[i], prompt[i])


@pytest.mark.parametrize("name", ["default", "eagle", "tail"])
def test_plan_stores_defaults_equal_the_scalar_defaults(name):
    """Left out, the optional arguments mean what the scalar's defaults mean: the prompt is the request,
    offload_prompt_only, not finished, not loaded from the offload tier, nothing stored yet."""
    geom = GEOMS[name]
    n = [0, 33, 64, 65, 130, 200]
    computed = [0, 33, 64, 60, 130, 200]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed)
    for i in range(len(n)):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=computed[i]), i
    prompt = [0, 20, 64, 40, 100, 150]  # decoding past the prompt: only the prompt is offloaded by default
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt)
    for i in range(len(n)):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=computed[i],
                                             num_prompt_tokens=prompt[i]), i


@pytest.mark.parametrize(
    "kwargs, code, field",
    [
        ({"num_tokens": [64, -1], "num_computed_tokens": [64, 0]}, "negative", "num_tokens"),
        ({"num_tokens": [64, 64], "num_computed_tokens": [64, -1]}, "negative", "num_computed_tokens"),
        ({"num_tokens": [64, 64], "num_computed_tokens": [64]}, "length_mismatch", "num_computed_tokens"),
        ({"num_tokens": [64, 64], "num_computed_tokens": [64, 64], "num_prompt_tokens": [-1, 3]}, "negative",
         "num_prompt_tokens"),
        ({"num_tokens": [64, 64], "num_computed_tokens": [64, 64], "num_prompt_tokens": [3]}, "length_mismatch",
         "num_prompt_tokens"),
    ],
)
def test_plan_stores_refusals_name_the_argument(kwargs, code, field):
    with pytest.raises(kvgeom.QueryError) as e:
        batch.plan_stores(GEOMS["default"], **kwargs)
    assert (e.value.code, e.value.problems[0].field) == (code, field)


def test_lookup_hits_refusal_names_num_tokens():
    # as the scalar lookup_hit's refusal; mutation pass 4 (lookup_hits 4, 8, 9 renamed or dropped the field)
    with pytest.raises(kvgeom.QueryError) as e:
        batch.lookup_hits(GEOMS["default"], [64, -1], stored={})
    assert (e.value.code, e.value.problems[0].field, e.value.problems[0].values) == (
        "negative", "num_tokens", {"num_tokens": -1})


# ---------------------------------------------------------------------------------------------
# skipped_tokens, rswa_gap_blocks, store_holdback: the small per-request rules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, group", [("default", 0), ("default", 1), ("sliding_k2", 1), ("chunked", 1),
                                         ("sliding", 1)])
def test_skipped_tokens_equal_the_scalar(name, group):
    """Leading tokens a resumed request does not need: 0 (full attention), N - 1 (Mamba), N - window need
    (sliding), rdown(N, need + 1) (chunked local), at 0 and on both sides of the window."""
    geom = GEOMS[name]
    ends = [0, 1, 15, 16, 17, 31, 32, 33, 34, 35, 64, 70, 71, 72, 100, 1000]
    got = batch.skipped_tokens(geom, group, ends)
    assert got.dtype == np.int64
    assert got.tolist() == [hits.skipped_tokens(geom, group, e) for e in ends]


def test_skipped_tokens_refuses_a_negative_end_token():
    with pytest.raises(kvgeom.QueryError) as e:
        batch.skipped_tokens(GEOMS["default"], 1, [16, -1])
    assert (e.value.code, e.value.problems[0].field) == ("negative", "end_token")


def test_load_plan_arrays_of_a_group_that_loads_nothing_are_zero():
    """plan_loads' contract: a group that loads nothing for a request has ``loads`` false, zeros in every
    entry and key field and state block -1 (int64 arrays throughout)."""
    geom = GEOMS["default"]
    held = np.zeros((3, 8), dtype=bool)
    held[0, :4] = True
    lp = batch.plan_loads(geom, batch.lookup_hits(geom, [65, 65, 40], stored={0: held, 1: held},
                                                   local_computed_tokens=[0, 32, 0]))
    assert lp.hits.hit_tokens.tolist() == [64, 0, 0]
    for g in lp.groups:
        assert g.loads.tolist() == [True, False, False]
        for field in ("first_entry", "stop_entry", "first_key_chunk", "stop_key_chunk", "skip_in_first_chunk"):
            a = getattr(g, field)
            assert a.dtype == np.int64 and a[1:].tolist() == [0, 0], (g.index, field)
        assert g.state_block.dtype == np.int64
    assert lp.groups[1].state_block.tolist() == [3, -1, -1]  # align Mamba: (64 - 1) // 16; -1 without a load
    assert lp.groups[0].state_block.tolist() == [-1, -1, -1]  # attention has no state block


def test_a_chunked_local_group_loads_nothing_at_its_chunk_start():
    """Chunked local attention (chunk 32): a hit ending at 64 starts a new attention chunk, so that group
    skips every token (rdown(64, 32) = 64) and loads nothing although the hit is 64 tokens; at 79 it loads
    the blocks of [64, 79)."""
    geom = GEOMS["chunked"]
    held = np.ones((2, 8), dtype=bool)
    h = batch.lookup_hits(geom, [65, 80], stored={0: held, 1: held})
    assert h.end_token.tolist() == [64, 79]
    lp = batch.plan_loads(geom, h)
    assert lp.groups[0].loads.tolist() == [True, True]
    assert lp.groups[1].loads.tolist() == [False, True]
    assert (lp.groups[1].first_entry.tolist(), lp.groups[1].stop_entry.tolist()) == ([0, 4], [0, 5])
    for i, n in enumerate((65, 80)):
        assert lp.plan(i) == hits.plan_load(geom, hits.lookup_hit(geom, n, stored={0: list(range(16, 129, 16)),
                                                                               1: list(range(16, 129, 16))}))


def test_a_one_token_hit_loads_its_block():
    """Block size 1 (H = 1): a hit of exactly one token is a load of one block and one key."""
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1}], "offload": {}})
    h = batch.lookup_hits(geom, [2, 3], stored={0: np.array([[True, False], [True, True]])})
    assert h.hit_tokens.tolist() == [1, 2]
    lp = batch.plan_loads(geom, h)
    for i, n in enumerate((2, 3)):
        want = hits.lookup_hit(geom, n, stored={0: [1] if i == 0 else [1, 2]})
        assert h.hit(i) == want
        assert lp.plan(i) == hits.plan_load(geom, want)
    assert lp.plan(0)[0].load_keys == (1,)


RSWA = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": 16, "rswa_window": 40}]})


RSWA0 = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": 16, "rswa_window": 0}]})


@pytest.mark.parametrize(
    "geom, prompt, computed",
    [
        # no block freed while the window still reaches the prompt's end; blocks freed once it moves past
        (RSWA, [50, 50, 50, 50, 48, 0, 16], [50, 100, 120, 160, 48, 0, 100]),
        # on span edges: the prompt on a block end, the computed count W past it
        (RSWA, [32, 32, 33, 31], [72, 73, 200, 71]),
        # int64-sized counts: exact integer division (a float quotient would round)
        (RSWA, [2**62, 5, 2**60 + 3], [INT64_MAX, INT64_MAX - 7, 2**62 + 12345]),
        # a window of 0 tokens: everything between the prompt and the computed count is freed
        (RSWA0, [16, 16, 0], [32, 47, 64]),
    ],
)
def test_rswa_gap_blocks_equal_the_scalar(geom, prompt, computed):
    """Blocks an rswa group frees between the prompt and the window: [cdiv(P, S), max(.., max(P, T - W) // S))."""
    start, stop = batch.rswa_gap_blocks(geom, 0, prompt, computed)
    assert start.dtype == stop.dtype == np.int64
    for i, (p, t) in enumerate(zip(prompt, computed, strict=True)):
        assert range(int(start[i]), int(stop[i])) == hits.rswa_gap_blocks(geom, 0, p, t), i


@pytest.mark.parametrize(
    "geom, prompt, computed, code, field",
    [
        # the first request computed less than its prompt: the scalar's refusal for that request
        (RSWA, [50, 60], [50, 59], "computed_before_prompt", None),
        # a group without an rswa window: the scalar's refusal (as for an empty batch)
        (GEOMS["default"], [10], [20], None, None),
        (GEOMS["default"], [], [], None, None),
        # one computed count per prompt
        (RSWA, [50, 50], [60], "length_mismatch", "num_computed_tokens"),
        # counts are non-negative: the field named is the offending argument
        (RSWA, [50, -1], [60, 60], "negative", "num_prompt_tokens"),
        (RSWA, [50, 50], [60, -1], "negative", "num_computed_tokens"),
    ],
)
def test_rswa_gap_blocks_refuses(geom, prompt, computed, code, field):
    with pytest.raises(kvgeom.QueryError) as e:
        batch.rswa_gap_blocks(geom, 0, prompt, computed)
    if field is not None:
        assert (e.value.code, e.value.problems[0].field) == (code, field)
        if code == "length_mismatch":
            assert e.value.problems[0].values == {"length": 1, "expected": 2}
    else:
        with pytest.raises(kvgeom.QueryError) as s:
            hits.rswa_gap_blocks(geom, 0, prompt[-1] if prompt else 0, computed[-1] if computed else 0)
        assert (e.value.code, e.value.problems[0].field) == (s.value.code, s.value.problems[0].field)
        assert e.value.problems[0].values == s.value.problems[0].values
        if code:
            assert e.value.code == code


@pytest.mark.parametrize("name", ["eagle", "eagle_sliding", "default"])
def test_store_holdback_equals_the_scalar(name):
    """An eagle group's last offloadable chunk is held back while the request decodes past its prompt and has
    not finished (kvgeom.hits.store_holdback_chunks); other groups store every storable chunk."""
    geom = GEOMS[name]
    rows = [(s, o, p, f) for s in (0, 1, 2, 3, 5) for o in (0, 16, 31, 32, 33, 64, 80) for p in (0, 32, 64)
            for f in (False, True)]
    s, o, p, f = (np.array(c) for c in zip(*rows, strict=True))
    for og in geom.offload.groups:
        got = batch.hits.store_holdback(og, s, o, p, f)
        want = [hits.store_holdback_chunks(geom, og.index, int(a), int(b), int(c), bool(d)) for a, b, c, d in rows]
        assert got.tolist() == want, og.index


# ---------------------------------------------------------------------------------------------
# lookup_resident and RequestChains: the tracked chains and their refusals
# ---------------------------------------------------------------------------------------------


def test_request_chains_rows_hold_the_interned_ids_and_reuse_freed_rows():
    """A row holds exactly the ids of its request's hashes, in order, with 0 past the chain and at least one
    0 column after the longest chain (the column a batch view clips out-of-range reads to); a removed
    request's row is zeroed and reused by the next new request."""
    r = kvgeom.Residency()
    chains = RequestChains(r)
    chains.update("a", [b"x", b"y"])
    chains.update("a", [b"x", b"y", b"z"])  # only the new tail is interned
    chains.update("b", [b"y"])
    assert len(chains) == 2
    ids = r.intern([b"x", b"y", b"z"]).tolist()
    ra, rb = chains.rows(["a", "b"]).rows.tolist()
    assert (ra, rb) == (0, 1)
    assert chains.ids[ra, :4].tolist() == [*ids, 0]
    assert chains.ids[rb, :2].tolist() == [ids[1], 0]
    long = [b"h%d" % i for i in range(130)]  # grows the matrix past its first width
    chains.update("b", [b"y", *long])
    assert chains.ids.shape[1] > 131 and not chains.ids[:, -1].any()
    assert chains.ids[rb, :131].tolist() == r.intern([b"y", *long]).tolist()
    assert chains.ids[ra, :4].tolist() == [*ids, 0]
    chains.remove("a")
    chains.remove("never-seen")  # forgetting an unknown request is a no-op
    assert len(chains) == 1 and not chains.ids[ra].any()
    chains.update("c", [b"z"])
    assert chains.rows(["c"]).rows.tolist() == [ra]
    assert chains.ids[ra, :2].tolist() == [ids[2], 0]
    for i in range(12):  # more requests than the first row capacity
        chains.update(("n", i), [b"q%d" % i])
    assert chains.ids[chains.rows([("n", 11)]).rows[0], :2].tolist() == [r.intern([b"q11"])[0], 0]
    assert chains.ids[rb, :131].tolist() == r.intern([b"y", *long]).tolist()


@pytest.mark.parametrize(
    "call, code, field",
    [
        # RequestChains reads a Residency
        (lambda r, c: RequestChains(object()), "bad_residency", "residency"),
        # a chain is a sequence of hashes, not one bytes or str value, not a generator
        (lambda r, c: c.update("a", b"h0h1"), "bad_block_hashes", "block_hashes"),
        (lambda r, c: c.update("a", "h0"), "bad_block_hashes", "block_hashes"),
        (lambda r, c: c.update("a", iter([b"h0"])), "bad_block_hashes", "block_hashes"),
        # a tracked chain only grows
        (lambda r, c: c.update("t", [b"h0"]), "chain_shrank", "block_hashes"),
        # rows of a request never updated
        (lambda r, c: c.rows(["t", "u"]), "unknown_request", "request_ids"),
        # lookup_resident reads a Residency, and chains interned against that same Residency
        (lambda r, c: lookup_resident(GEOMS["default"], {}, [[]], [0]), "bad_residency", "residency"),
        (lambda r, c: lookup_resident(GEOMS["default"], kvgeom.Residency(), c.rows(["t"]), [0]),
         "foreign_chains", "chains"),
        (lambda r, c: lookup_resident(GEOMS["default"], r, b"abc", [0]), "bad_chains", "chains"),
        (lambda r, c: lookup_resident(GEOMS["default"], r, 3, [0]), "bad_chains", "chains"),
        # one chain per request
        (lambda r, c: lookup_resident(GEOMS["default"], r, c.rows(["t"]), [0, 0]), "length_mismatch", "chains"),
        (lambda r, c: lookup_resident(GEOMS["default"], r, [[], []], [0]), "length_mismatch", "chains"),
        # a geometry without offloading
        (lambda r, c: lookup_resident(kvgeom.resolve({"groups": [FA16]}), r, [[]], [0]), "no_offload", None),
        # token counts are non-negative
        (lambda r, c: lookup_resident(GEOMS["default"], r, [[]], [-1]), "negative", "num_tokens"),
    ],
)
def test_resident_lookup_refusals_name_the_field(call, code, field):
    r = kvgeom.Residency()
    c = RequestChains(r)
    c.update("t", [b"h0", b"h1"])
    with pytest.raises(kvgeom.QueryError) as e:
        call(r, c)
    assert e.value.code == code
    if field is not None:
        assert e.value.problems[0].field == field


@pytest.mark.parametrize(
    "name, n, lengths, short, needed",
    [
        # H = 16: a request of 65 tokens has 4 hashes; the second request's chain holds 3
        ("default", [16, 65, 64], [1, 3, 4], 1, 4),
        # the first short chain is named, not a later one; 0 tokens need no hash
        ("default", [0, 47, 33], [0, 1, 0], 1, 2),
        # the eagle look-ahead: a request has one hash per H tokens less the look-ahead tokens
        ("eagle", [64, 80], [4, 3], 1, None),
    ],
)
def test_short_chains_are_refused_with_the_request_and_counts(name, n, lengths, short, needed):
    """kvgeom.probes.check_chain_length per request: block_hashes_too_short names the first request whose
    chain is short, its hash count and the hashes its num_tokens needs (rdown(n - look-ahead, H) / H)."""
    geom = GEOMS[name]
    H = geom.hash_block_size
    if needed is None:
        needed = max(n[short] - geom.hash_lookahead_tokens, 0) // H
    chains = [[b"c%d-%d" % (i, j) for j in range(k)] for i, k in enumerate(lengths)]
    r = kvgeom.Residency()
    with pytest.raises(kvgeom.QueryError) as e:
        lookup_resident(geom, r, chains, n)
    p = e.value.problems[0]
    assert (p.code, p.field) == ("block_hashes_too_short", "chains")
    assert p.values == {"request": short, "num_hashes": lengths[short], "needed": needed}
    # one hash more for that request is enough (the bound is inclusive)
    chains[short].append(b"more")
    for i in range(len(n)):
        chains[i] += [b"pad%d-%d" % (i, j) for j in range(n[i] // H)]
    lookup_resident(geom, r, chains, n)


def test_resident_lookup_of_no_request_through_tracked_rows():
    """An empty selection of tracked rows is an empty batch (its row array is an int64 index array)."""
    r = kvgeom.Residency()
    chains = RequestChains(r)
    chains.update("a", [b"h0"])
    rows = chains.rows([])
    assert rows.rows.dtype == np.int64 and rows.rows.shape == (0,)
    got = lookup_resident(GEOMS["default"], r, rows, [])
    assert len(got) == 0 and got.end_token.dtype == np.int64


def test_request_chains_first_hashes_on_a_late_row():
    """Requests without hashes take rows without growing the id matrix; the first hashes of a request on row
    9 must still get a row of the matrix (rows grow to at least row + 1)."""
    geom = GEOMS["sliding"]
    r = kvgeom.Residency()
    chains = RequestChains(r)
    for i in range(9):
        chains.update(i, [])
    chain = [b"late%d" % j for j in range(5)]
    for h in chain:
        r.add(0, h)
        r.add(1, h)
    chains.update(9, chain)
    assert chains.ids.shape[0] >= 10
    assert chains.ids[9, :6].tolist() == [*r.intern(chain).tolist(), 0]
    got = lookup_resident(geom, r, chains.rows([9, 0]), [80, 15])
    assert got.hit(0) == hits.lookup_hit(geom, 80, stored=r, block_hashes=chain)
    assert got.end_token.tolist()[1] == 0


def test_resident_reads_past_the_id_matrix_read_as_not_held():
    """The prefix scan reads a window of 16 chunks past a local prefix; on the id matrix's last row, with
    a chain filling all but its last column, those reads fall past the matrix and read as not held
    (the view clips them to the zero last column)."""
    geom = GEOMS["sliding"]  # C = H = 16: chunk j is hash column j
    r = kvgeom.Residency()
    chains = RequestChains(r)
    per = []
    for i in range(8):  # rows 0..7: the matrix's first capacity is 8 rows of 64 columns
        chain = [b"full%d-%d" % (i, j) for j in range(63)]
        for h in chain:
            r.add(0, h)
            r.add(1, h)
        chains.update(i, chain)
        per.append(chain)
    # (the matrix's capacity is not part of the contract: with another one the row still compares answers)
    n = [63 * 16] * 8
    local = [60 * 16] * 8
    got = lookup_resident(geom, r, chains.rows(list(range(8))), n, local_computed_tokens=local)
    for i in range(8):
        assert got.hit(i) == hits.lookup_hit(geom, n[i], stored=r, block_hashes=per[i],
                                             local_computed_tokens=local[i]), i


def test_a_request_of_no_token_needs_no_hash():
    """H = 1 (block size 1): a request of 0 tokens needs 0 hashes, one of 2 tokens needs 2."""
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1}], "offload": {}})
    r = kvgeom.Residency()
    r.add(0, b"a")
    assert lookup_resident(geom, r, [[], [b"a", b"b"]], [0, 2]).hit_tokens.tolist() == [0, 1]
    with pytest.raises(kvgeom.QueryError) as e:
        lookup_resident(geom, r, [[], [b"a"]], [0, 2])
    assert e.value.problems[0].values == {"request": 1, "num_hashes": 1, "needed": 2}


def test_resident_lookup_without_any_hash_reads_nothing():
    """Chains with no hash at all (every request shorter than H): an empty id matrix, every hit 0."""
    geom = GEOMS["default"]
    r = kvgeom.Residency()
    got = lookup_resident(geom, r, [[], []], [10, 15], local_computed_tokens=[0, 15])
    assert [got.hit(i) for i in range(2)] == [hits.lookup_hit(geom, x, stored={}, local_computed_tokens=c)
                                              for x, c in ((10, 0), (15, 15))]


def test_resident_lookup_holder_selects_the_residency_bit():
    """holder h reads the keys added for holder h only (Residency.held_array(group, holder))."""
    geom = GEOMS["default"]
    chain = [b"h%d" % i for i in range(4)]
    r = kvgeom.Residency()
    for i in range(4):
        r.add(0, chain[i], holder=1)
        r.add(1, chain[i], holder=1)
    assert lookup_resident(geom, r, [chain], [65], holder=1).end_token.tolist() == [64]
    assert lookup_resident(geom, r, [chain], [65]).end_token.tolist() == [0]
    assert lookup_resident(geom, r, [chain], [65], holder=1).hit(0) == hits.lookup_hit(
        geom, 65, stored=r, block_hashes=chain, holder=1)


# ---------------------------------------------------------------------------------------------
# stored matrices and held-key views (kvgeom.batch.probes)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stored, field, why",
    [
        # stored maps a group index to a matrix
        ([np.ones((2, 4), dtype=bool)], "stored", None),
        # one row per request
        ({0: np.ones((3, 4), dtype=bool)}, "stored.0", None),
        ({0: [[True], [False], [True]]}, "stored.0", "it has 3 rows"),
        # a bool matrix (an empty matrix of any dtype is fine; a 1-D row is not a matrix)
        ({0: np.ones((2, 4), dtype=np.int64)}, "stored.0", None),
        ({1: np.ones(2, dtype=bool)}, "stored.1", None),
        ({0: [[True, False], [True]]}, "stored.0", "numpy cannot read it"),
        # a range of 10**12 ends is refused before numpy copies it
        ({0: range(10**12)}, "stored.0", "it has 1000000000000 rows"),
        ({0: 5}, "stored.0", None),
    ],
)
def test_stored_matrices_refusals_name_the_group(stored, field, why):
    with pytest.raises(kvgeom.QueryError) as e:
        batch.lookup_hits(GEOMS["default"], [64, 32], stored=stored)
    p = e.value.problems[0]
    assert (p.code, p.field) == ("bad_stored", field)
    if why:
        assert why in p.message


def test_stored_matrices_fill_missing_groups_and_accept_lists():
    """A group stored leaves out holds nothing (an empty (requests, 0) matrix); a nested list of bools is
    read as the matrix; an empty int matrix is an empty matrix."""
    geom = GEOMS["default"]
    out = stored_matrices(geom, geom.offload, {1: [[True, False], [False, True]], 0: np.zeros((2, 0), dtype=int)}, 2)
    assert sorted(out) == [0, 1]
    assert out[0].shape == (2, 0) and out[0].dtype == np.bool_
    assert out[1].tolist() == [[True, False], [False, True]] and out[1].dtype == np.bool_
    empty = stored_matrices(geom, geom.offload, {}, 3)
    assert {k: (v.shape, v.dtype) for k, v in empty.items()} == {0: ((3, 0), np.bool_), 1: ((3, 0), np.bool_)}


class _ArrayOnly:
    """An object numpy reads through the array protocol only (no len())."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


def test_stored_matrix_without_len_is_read_by_numpy():
    """A stored value numpy can read as a bool matrix is one, even without len() (the row count is then
    checked on the array)."""
    geom = GEOMS["default"]
    held = np.ones((2, 4), dtype=bool)
    got = batch.lookup_hits(geom, [64, 65], stored={0: _ArrayOnly(held), 1: _ArrayOnly(held)})
    assert got.end_token.tolist() == batch.lookup_hits(geom, [64, 65], stored={0: held, 1: held}).end_token.tolist()
    with pytest.raises(kvgeom.QueryError) as e:
        batch.lookup_hits(geom, [64, 65, 1], stored={0: _ArrayOnly(held)})
    assert (e.value.code, e.value.problems[0].field) == ("bad_stored", "stored.0")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_group_left_out_of_stored_holds_nothing(name):
    """stored leaves a group out: that group holds no key (lookup_hit with its list empty), whether it is
    scanned as a prefix (full attention) or by windows (sliding, chunked, Mamba)."""
    geom = GEOMS[name]
    H = geom.hash_block_size
    n, local, prompt, stored = _lookup_case(geom, 1)
    for og in geom.offload.groups:
        part = {g: m for g, m in stored.items() if g != og.index}
        h = batch.lookup_hits(geom, n, stored=part, num_prompt_tokens=prompt, local_computed_tokens=local)
        for i in range(len(n)):
            held = {g: [(c + 1) * H for c in np.flatnonzero(m[i])] for g, m in part.items()}
            want = scalar(("left out", name, og.index, i), hits.lookup_hit, geom, n[i], stored=held,
                          num_prompt_tokens=prompt[i], local_computed_tokens=local[i])
            assert h.hit(i) == want, (og.index, i)


def test_held_matrix_reads_chunks_and_hash_columns_inside_the_matrix_only():
    """Chunk j of a group with hpc hashes per chunk is column (j + 1) * hpc - 1; columns outside [0, width)
    read as not held (a probe's answer for keys past its bound)."""
    m = np.array([[True, True, False, True, True, True], [False, True, True, True, False, True]])
    v = HeldMatrix(m, 2)
    assert (v.width, v.chunks, v.hpc) == (6, 3, 2)
    rows = np.array([[0], [1]])
    assert v(rows, np.array([-1, 0, 1, 2, 3])).tolist() == [[False, True, True, True, False],
                                                           [False, True, True, True, False]]
    assert v.hashes(rows, np.array([-2, -1, 0, 2, 4, 5, 6, 7])).tolist() == [
        [False, False, True, False, True, True, False, False], [False, False, False, True, False, True, False, False]]
    assert v.hashes(np.array([1, 0]), np.array([0, 3])).tolist() == [False, True]
    empty = HeldMatrix(np.zeros((2, 0), dtype=bool), 1)
    assert empty.chunks == 0
    assert empty(rows, np.array([0, 1])).tolist() == [[False, False], [False, False]]
    assert empty.hashes(np.array([0, 1]), np.array([0, 0])).tolist() == [False, False]
    # a non-contiguous matrix (a column slice) reads as its values
    s = HeldMatrix(m[:, ::2], 1)
    assert s.hashes(np.array([0, 1, 1]), np.array([1, 1, 2])).tolist() == [False, True, False]


def test_eagle_pair_view_needs_both_chunks_and_passes_hash_keys_through():
    """An eagle group's pair probe: chunk j is held iff chunks j and j + 1 are; keys by hash index unchanged."""
    m = np.array([[True, True, True, False, True, True]])
    v = eagle_pair_held(HeldMatrix(m, 1))
    assert v.chunks == 6
    r = np.zeros(7, dtype=np.int64)
    assert v(r, np.arange(7)).tolist() == [True, True, False, False, True, False, False]
    assert v.hashes(r[:6], np.arange(6)).tolist() == m[0].tolist()


# Store masks (kvgeom/batch/masks.py): one geometry per mask rule plan_stores branches on, each under the
# retention settings that change the mask: None (segments of the alignment and a final tail), 0 (reachable
# boundaries only: kept_from_points), and periodic R (segments of R plus the reachable boundaries).
_FA64 = {"kind": "full_attention", "block_size": 64}
_PMU16 = {"prefix_match_unit": 16}
_EAGLE2 = {"method": "eagle", "num_speculative_tokens": 2}
MASK_CONFIGS = {
    # sliding block 16 under a 64-token alignment: segments of 4 blocks keep their last 2 (window 20)
    "swa64": ({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 20}],
               "offload": {}}, _PMU16, (None, 0, 64, 128)),
    # a window of 40 tokens (3 blocks) under the same alignment
    "swa64_w40": ({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
                   "offload": {}}, _PMU16, (None, 0, 128)),
    # two blocks per chunk (a chunk survives when one of its blocks is kept)
    "swa_k2": ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 24}],
                "offload": {"blocks_per_chunk": 2}}, {}, (None, 0, 96)),
    # a run of 3 blocks in chunks of 2 (per - need odd under R = 96: a tail starts inside a chunk)
    "swa_k2_w40": ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
                    "offload": {"blocks_per_chunk": 2}}, {}, (None, 0, 96)),
    # an EAGLE sliding drafter: runs of need + 1 blocks, one block later; no final tail
    "eagle_swa64": ({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40,
                                        "drafter": True}], "offload": {}, "speculative": _EAGLE2},
                    _PMU16, (None, 0, 64, 128)),
    # a sliding block (32) wider than the alignment (16): the mask is dense
    "swa32_fa16": ({"groups": [FA16, {"kind": "sliding_window", "block_size": 32, "sliding_window": 40}],
                    "offload": {}}, {}, (None, 0, 64)),
    # a one-block run (window 16 over blocks of 16)
    "swa64_w16": ({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                   "offload": {}}, _PMU16, (None, 0, 64)),
    # the EAGLE drafter under a 128-token alignment: retention None keeps segment tails, still no final tail
    "eagle_swa128": ({"groups": [{"kind": "full_attention", "block_size": 128},
                                 {"kind": "sliding_window", "block_size": 16, "sliding_window": 40, "drafter": True}],
                      "offload": {}, "speculative": _EAGLE2}, _PMU16, (None,)),
    # a one-token window needs no history: nothing is stored
    "swa_w1": ({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 1}],
                "offload": {}}, _PMU16, (None, 0, 64)),
    # align Mamba (state block per chunk), k = 1 and k = 4, alignment 32 and 64
    "mamba_align": (kvgeom.DEFAULT_CONFIG, {}, (None, 0, 32, 64)),
    "mamba_align64": ({"groups": [_FA64, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}],
                       "offload": {}}, _PMU16, (0, 64, 128)),
    "mamba_align_k4": ({"groups": [FA16, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}],
                        "offload": {"blocks_per_chunk": 4}}, {}, (None, 0, 64, 128)),
    # positional Mamba ("all"): a chunk of k blocks survives when one of its blocks is kept
    "mamba_all": ({"groups": [FA16, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "all"}],
                   "offload": {}}, {}, (0, 16, 32, 48)),
    # R = span: every block is a retention boundary, the mask is dense
    "mamba_align16": ({"groups": [FA16, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}],
                       "offload": {}}, {}, (16,)),
    # chunked local attention: never thinned (the only other family offloaded beside full attention)
    "chunked": ({"groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}],
                 "offload": {}}, {}, (None, 0)),
    "mamba_all_k4": ({"groups": [FA16, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "all"}],
                      "offload": {"blocks_per_chunk": 4}}, {}, (None, 0, 64, 128)),
    # one-token Mamba blocks (alignment 1): a reachable boundary at 0 keeps no block
    "mamba1_align": ({"groups": [{"kind": "mamba", "block_size": 1, "mamba_cache_mode": "align"}], "offload": {}},
                     {}, (None, 0, 4)),
    "mamba1_all": ({"groups": [{"kind": "mamba", "block_size": 1, "mamba_cache_mode": "all"}], "offload": {}},
                   {}, (0, 4)),
}
MASK_GEOMS = {
    (name, R): kvgeom.resolve({**cfg, "cache": {**cache, "retention_interval": R}})
    for name, (cfg, cache, retentions) in MASK_CONFIGS.items()
    for R in retentions
}


def _mask_case(geom, seed, size=14):
    """Requests, stored starts and reachable boundaries on and next to the edges a store mask branches on:
    multiples of the alignment, of R and of a chunk, one token and one block either side."""
    rng = np.random.default_rng(seed)
    og = geom.offload.groups[-1]
    C = og.tokens_per_chunk
    unit = max(C, geom.offload.alignment_tokens or C, geom.hit_alignment_tokens or C,
               geom.config.cache.retention_interval or C)
    step = [0, 1, -1, og.tokens_per_block, -og.tokens_per_block, C, -C]

    def near(top):
        return int(max(int(rng.integers(0, top + 1)) * unit + step[int(rng.integers(0, len(step)))], 0))

    n = [near(6) for _ in range(size)]
    n[0], n[1] = 0, 6 * unit + 1
    prompt = [x if rng.random() < 0.5 else min(near(4), x) for x in n]
    computed = [x if rng.random() < 0.7 else near(6) for x in n]
    fin = [bool(rng.random() < 0.5) for _ in n]
    stored = {og.index: [int(rng.integers(0, 4)) if rng.random() < 0.5 else max(x // C - int(rng.integers(0, 4)), 0)
                         for x in n]}
    width = 0 if seed == 5 else 3  # seed 5: a reachable array with no column
    reach = [[near(6) if rng.random() < 0.75 else -1 for _ in range(width)] for _ in n] if seed % 2 else None
    return n, computed, prompt, stored, reach, fin


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("key", list(MASK_GEOMS), ids=[f"{name}-R{R}" for name, R in MASK_GEOMS])
def test_store_masks_equal_the_scalar_masks(key, seed):
    """plan_stores through each store-mask rule (batch/masks.py: chunk_kept, kept_from_points,
    swa_store_horizons) equals plan_store request by request: sliding windows (k = 1, 2, EAGLE drop, a one-token
    window) and Mamba (align and positional, k = 1, 4) under retention None, 0 and periodic R, with stored starts,
    finished and decoding requests, and reachable boundaries (seeds 1, 3; seed 5: none at all) or the default
    replay boundary."""
    geom = MASK_GEOMS[key]
    n, computed, prompt, stored, reach, fin = _mask_case(geom, seed)
    for opo in (True, False):
        sp = batch.plan_stores(
            geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt, stored_chunks=stored,
            reachable=None if reach is None else np.array(reach, dtype=np.int64).reshape(len(n), -1),
            offload_prompt_only=opo,
            finished=np.array(fin),
        )
        for i in range(len(n)):
            want = scalar(("mask", key, seed, opo, i), hits.plan_store,
                geom, num_tokens=n[i], num_computed_tokens=computed[i], num_prompt_tokens=prompt[i],
                stored_chunks={g: v[i] for g, v in stored.items()},
                reachable=None if reach is None else tuple(t for t in reach[i] if t >= 0),
                offload_prompt_only=opo, finished=fin[i],
            )
            assert sp.plan(i) == want, (i, n[i], computed[i], prompt[i], fin[i])


@pytest.mark.parametrize("key", list(MASK_GEOMS), ids=[f"{name}-R{R}" for name, R in MASK_GEOMS])
def test_swa_store_horizons_equal_the_scalar_horizon(key):
    """batch.masks.swa_store_horizons is masks.swa_store_horizon per request (-1 where the scalar has no final
    tail, or None for the whole batch when no request can have one) for every offloaded group: none under a
    retention interval, none for a Mamba or attention group, none for an EAGLE sliding group; a sliding group's
    at the storable chunks once finished, at the prompt's chunks while the storable chunks are within them,
    else none."""
    from kvgeom.batch.masks import swa_store_horizons
    from kvgeom.masks import swa_store_horizon

    geom = MASK_GEOMS[key]
    rows = [(s, p, f) for s in (0, 1, 3, 4) for p in (0, 3, 5) for f in (False, True)]
    storable, prompt, fin = (np.array(col) for col in zip(*rows, strict=True))
    for og in geom.offload.groups:
        got = swa_store_horizons(geom, geom.groups[og.index], storable, prompt, fin)
        want = [swa_store_horizon(geom, og.index, storable_chunks=s, prompt_chunks=p, finished=f) for s, p, f in rows]
        if got is None:
            assert want == [None] * len(rows), og.index
        else:
            assert got.tolist() == [-1 if w is None else w for w in want], og.index


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("key", list(MASK_GEOMS), ids=[f"{name}-R{R}" for name, R in MASK_GEOMS])
def test_kept_chunks_equal_the_scalar_mask(key, seed):
    """batch.masks.kept_from_points and chunk_kept, called directly, keep the chunks ``[start, storable)`` the
    scalar reachable_block_mask keeps (a positional chunk: one of its k blocks; align Mamba: its state block;
    a sliding group under retention None: with the final segment's tail at swa_store_horizon), and give None
    exactly where the scalar mask is dense (kept_from_points: also for any retention but 0). Reachable arrays of
    3 columns (seed 1), none (seed 2) and 2 (seed 3: two runs of one request to merge in order)."""
    from kvgeom.batch.masks import chunk_kept, kept_from_points
    from kvgeom.boundaries import state_block_for_boundary
    from kvgeom.masks import reachable_block_mask, swa_store_horizon

    geom = MASK_GEOMS[key]
    R = geom.config.cache.retention_interval
    rng = np.random.default_rng(seed)
    k = geom.offload.blocks_per_chunk
    for og in geom.offload.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        unit = max(C, geom.offload.alignment_tokens, geom.hit_alignment_tokens, R or C)
        size = 10
        storable = rng.integers(0, 6 * unit // C + 2, size=size)
        storable[0] = 0
        start = np.minimum(rng.integers(0, 4, size=size), storable)
        prompt_chunks = rng.integers(0, 6 * unit // C + 2, size=size)
        fin = rng.random(size) < 0.5
        width = {1: 3, 2: 0, 3: 2}[seed]
        points = np.array([[int(max(rng.integers(0, 7) * unit + rng.choice([0, 1, -1, C, -C, og.tokens_per_block]), 0))
                            if rng.random() < 0.75 else -1 for _ in range(width)] for _ in range(size)],
                          dtype=np.int64).reshape(size, width)
        want, dense = [], False
        horizons = []
        for i in range(size):
            s, st = int(storable[i]), int(start[i])
            h = swa_store_horizon(geom, og.index, storable_chunks=s, prompt_chunks=int(prompt_chunks[i]),
                                  finished=bool(fin[i]))
            horizons.append(-1 if h is None else h * k)
            mask = reachable_block_mask(geom, og.index, s * k, first_block=st * k,
                                        reachable=[int(t) for t in points[i] if t >= 0],
                                        final_segment_end_block=None if h is None else h * k)
            dense = mask is None
            for j in range(st, s):
                if g.is_align_mamba:
                    kept = mask is None or state_block_for_boundary(geom, og.index, (j + 1) * C) in mask
                else:
                    kept = mask is None or any(b in mask for b in range(j * k, (j + 1) * k))
                if kept:
                    want.append((i, j))
        counts = np.maximum(storable - start, 0)
        req = np.repeat(np.arange(size, dtype=np.int64), counts)
        chunk = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts - start, counts)
        keep = chunk_kept(geom, og, g, chunk, req, storable * k, points, np.array(horizons, dtype=np.int64))
        assert (keep is None) == dense, og.index
        if keep is not None:
            assert list(zip(req[keep].tolist(), chunk[keep].tolist(), strict=True)) == want, og.index
        direct = kept_from_points(geom, og, g, start, storable, points)
        sparse = R == 0 and g.family in ("mamba", "sliding") and not dense
        assert (direct is not None) == sparse, og.index
        if direct is not None:
            rows, chunks = direct
            assert rows.dtype == chunks.dtype == np.int64, og.index
            assert list(zip(rows.tolist(), chunks.tolist(), strict=True)) == want, og.index


@pytest.mark.parametrize(("mode", "R", "kept"), [("align", 32, [[0, 2, 4, 6, 8]] * 2),
                                                 ("all", 32, [[0, 2, 4, 6, 8]] * 2),
                                                 ("all", 48, [[1, 4, 7], [2, 5, 8]])])
def test_periodic_mamba_masks_at_int64_scale_equal_the_scalar(mode, R, kept):
    """Decode chunks near 2**58 (requests of 2**62 tokens, the last 9 chunks left to store): the periodic
    retention terms stay exact integer arithmetic (a float quotient rounds chunk indices of that size), equal to
    plan_store; ``kept`` is the stored chunks relative to the first candidate."""
    geom = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": mode}],
                           "offload": {}, "cache": {"retention_interval": R}})
    n = [(1 << 62) + 5, (1 << 62) + 37]
    start = {og.index: [x // og.tokens_per_chunk - (9 if og.index else 3) for x in n] for og in geom.offload.groups}
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, num_prompt_tokens=[100, 100],
                           stored_chunks=start, offload_prompt_only=False)
    for i in range(len(n)):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i], num_prompt_tokens=100,
                               stored_chunks={g: v[i] for g, v in start.items()}, offload_prompt_only=False)
        assert [j - start[1][i] for j in want.groups[1].chunks] == kept[i]
        assert sp.plan(i) == want, i


def test_sliding_final_segments_at_int64_scale_equal_the_scalar():
    """Retention None, segments of 4 sliding blocks keeping their last 2, chunks near 2**58 (requests of 2**62
    tokens, the last 9 chunks left to store): the segment arithmetic stays exact integer arithmetic (a float
    quotient rounds chunk indices of that size), equal to plan_store; the kept chunks relative to the first
    candidate are written out."""
    geom = MASK_GEOMS[("swa64", None)]
    n = [(1 << 62) + 5, (1 << 62) + 37, (1 << 62) + 100]
    start = {og.index: [x // og.tokens_per_chunk - (9 if og.index else 3) for x in n] for og in geom.offload.groups}
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, stored_chunks=start)
    kept = [[0, 3, 4, 7, 8], [1, 2, 5, 6, 7, 8], [1, 2, 5, 6, 7, 8]]
    for i in range(len(n)):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i],
                               stored_chunks={g: v[i] for g, v in start.items()})
        assert [j - start[1][i] for j in want.groups[1].chunks] == kept[i]
        assert sp.plan(i) == want, i


def test_periodic_sliding_masks_at_int64_scale_and_at_token_zero_equal_the_scalar():
    """Periodic retention over a sliding group: reachable boundaries near 2**62 keep their runs in exact integer
    arithmetic (a float quotient rounds block indices of that size); with one-token blocks (alignment 1) a
    boundary at token 0 has no block before it, so it keeps nothing. Equal to plan_store, kept chunks written
    out (relative to the first candidate for the int64-sized requests)."""
    geom = kvgeom.resolve({"groups": [_FA64, {"kind": "sliding_window", "block_size": 16, "sliding_window": 20}],
                           "offload": {}, "cache": {**_PMU16, "retention_interval": 128}})
    n = [(1 << 62) + 5, (1 << 62) + 37]
    start = {og.index: [x // og.tokens_per_chunk - (9 if og.index else 3) for x in n] for og in geom.offload.groups}
    reach = np.array([[x - 70, x - 130] for x in n], dtype=np.int64)
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, stored_chunks=start, reachable=reach)
    for i, kept in enumerate([[0, 7, 8], [1, 2, 5, 6]]):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i],
                               stored_chunks={g: v[i] for g, v in start.items()}, reachable=reach[i].tolist())
        assert [j - start[1][i] for j in want.groups[1].chunks] == kept
        assert sp.plan(i) == want, i
    one = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1},
                                     {"kind": "sliding_window", "block_size": 1, "sliding_window": 2}],
                          "offload": {}, "cache": {"retention_interval": 4}})
    reach = [[0, 5], [0, -1]]
    sp = batch.plan_stores(one, num_tokens=[10, 11], num_computed_tokens=[10, 11], reachable=np.array(reach))
    for i, (tokens, kept) in enumerate([(10, (3, 4, 7)), (11, (3, 7))]):
        want = hits.plan_store(one, num_tokens=tokens, num_computed_tokens=tokens,
                               reachable=[t for t in reach[i] if t >= 0])
        assert want.groups[1].chunks == kept
        assert sp.plan(i) == want, i
# -- a finished request's store plan below what it stored (plan_stores: the revisit mask keep_prompt, Mamba
# hand-offs of a finished request), one request each, as the scalar plan_store (the oracle); the scalar's
# chunks are written out. Found by a differential search over random store batches (issue 19 mutation pass):
# each row tells mutants of the revisit / hand-off code from the code. The arrays are read as documented too:
# ``request`` repeats the request's index for each chunk, ``partial_tail`` is -1 where there is none.
_SW_REVISIT = {"cache": {"retention_interval": None, "prefix_match_unit": 16}, "offload": {"blocks_per_chunk": 2}}
FINISHED_STORE_ROWS = [
    # sliding window 40 under attention blocks of 64 (a segment is 4 sliding blocks), 6 chunks stored, 64 of the
    # 122-token prompt computed when it finished at 133 tokens: chunk 0 is revisited (kept under the final
    # horizon, skipped under the prompt's)
    ({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "sliding_window", "block_size": 16,
                                                                "sliding_window": 40}], **_SW_REVISIT},
     133, 64, 122, 6, True, True, [(), (0,)]),
    # sliding window 24 (a segment keeps its last 2 blocks), 8 chunks stored, a 45-token prompt finished at 208
    # tokens, offloading past the prompt: chunk 5 is revisited
    ({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "sliding_window", "block_size": 16,
                                                                "sliding_window": 24}], **_SW_REVISIT},
     208, 208, 45, 8, False, False, [(), (5,)]),
    # dense retention (0), Mamba 16 with chunks of 32: a 96-token prompt finished at 221 tokens stores attention
    # chunks 0-2 and no Mamba state (no hand-off lands on a chunk end above what the mask keeps)
    ({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "cache": {"retention_interval": 0},
      "offload": {"blocks_per_chunk": 2}}, 221, 221, 96, 0, True, False, [(0, 1, 2), ()]),
]


@pytest.mark.parametrize(("cfg", "n", "computed", "prompt", "stored", "prompt_only", "loaded", "chunks"),
                         FINISHED_STORE_ROWS)
def test_a_finished_request_stores_below_its_stored_start_as_the_scalar(cfg, n, computed, prompt, stored,
                                                                         prompt_only, loaded, chunks):
    geom = kvgeom.resolve(cfg)
    groups = [og.index for og in geom.offload.groups]
    sp = batch.plan_stores(geom, num_tokens=[n], num_computed_tokens=[computed], num_prompt_tokens=[prompt],
                           finished=[True], loaded_from_offload=[loaded], offload_prompt_only=prompt_only,
                           stored_chunks={g: [stored] for g in groups})
    want = hits.plan_store(geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt, finished=True,
                           loaded_from_offload=loaded, offload_prompt_only=prompt_only,
                           stored_chunks={g: stored for g in groups})
    assert [s.chunks for s in want.groups] == chunks
    assert sp.plan(0) == want
    for gs in sp.groups:
        assert gs.request.tolist() == [0] * len(gs.chunk) and gs.partial_tail.tolist() == [-1]


def test_a_window_run_completed_at_a_scan_window_boundary_is_returned():
    """The batch scan reads 8, 16, 32... chunks per numpy step; a run that becomes long enough with the last chunk
    of one step is returned at the first position of the next, even when that chunk is a miss. FA 16 + sliding
    window 128 (8 chunks of 16), 641 tokens, every key held but the window group's at 512: the run 528-640 is
    whole, so the hit is 640 (vLLM 0.33, get_num_new_matched_tokens over exactly these keys, vllm_pending's
    harness: 640), as the scalar lookup_hit."""
    geom = kvgeom.resolve({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 128}],
                           "cache": {"retention_interval": None}, "offload": {}})
    n = 641
    stored = {0: list(range(16, n, 16)), 1: [e for e in range(16, n, 16) if e != 512]}
    held = {g: np.array([[(i + 1) * 16 in set(ends) for i in range(n // 16)]]) for g, ends in stored.items()}
    assert batch.lookup_hits(geom, [n], stored=held).hit(0) == hits.lookup_hit(geom, n, stored=stored)
    assert hits.lookup_hit(geom, n, stored=stored).hit_tokens == 640


# -- windowed scans (batch/hits.py::_scan_windows) at the edges the mutation pass found untested (issue 19): each
# row's hit is the scalar lookup_hit's and vLLM 0.33's (get_num_new_matched_tokens over exactly these keys, run with
# the setup of kvgeom.conformance.vllm_stores.run_lookup_trace plus max_num_new_tokens; the vLLM hit is written out).


def _eagle_sliding(window, k=1):
    """Full attention 16 beside an eagle sliding-window drafter of ``window`` tokens (blocks of 16, k per chunk)."""
    return {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": window, "drafter": True}],
            "offload": {"blocks_per_chunk": k}, "speculative": {"method": "eagle", "num_speculative_tokens": 2}}


SCAN_ROWS = {
    # sliding window 70 + 2 retained, C = 32, candidate 166 (max_num_new_tokens 167, minus one): a hit there needs
    # cdiv(71 + 26, 32) = 4 chunks; chunks 5, 4, 3 are held and 2 is not, so the scan falls back to chunks 1, 0
    # (vLLM: 64)
    "padded_need_at_one_past_a_multiple": (CONFIGS["sliding_k2"], [200], {0: 28, 1: [0, 1, 3, 4, 5]}, 167, [64]),
    # the same window, candidate 390 = 12 * 32 + 6 (needs 4 chunks), scanned over two numpy windows: after the misses
    # at chunks 9 and 6 a run needs only 3 chunks (on the chunk grid), and chunks 5, 4, 3 serve 192 (vLLM: 192)
    "need_after_a_miss_in_an_earlier_window": (
        CONFIGS["sliding_k2"], [420], {0: 52, 1: [0, 1, 3, 4, 5, 7, 8, 10, 11, 12]}, 391, [192]),
    # sliding window 33 (3 chunks), candidate 144: chunks 8..1 give no run of 3 and chunk 1 is a miss; the run of the
    # one chunk 0 reaches the scan's start and counts (vLLM: 16); the scan reads 8 chunks, then the ninth alone
    "a_short_run_at_the_start_after_a_full_numpy_window": (
        CONFIGS["sliding"], [145], {0: 9, 1: [0, 2, 4, 5, 7, 8]}, None, [16]),
    # Mamba alone: the key at 48 is missing, 32 is held, 16 is not: the one-key run at 32 is the hit (vLLM: 32)
    "a_one_key_run_between_misses": (CONFIGS["mamba"], [64], {0: [1]}, None, [32]),
    # Mamba alone, two requests: the first runs far past the 5-chunk matrix (the scan jumps to its end: key 80,
    # vLLM 80); the second's candidate 32 lies inside it, key 32 missing, key 16 held (vLLM: 16): the jump of the
    # first request must not move the second's scan
    "a_jump_past_the_matrix_leaves_the_other_requests": (
        CONFIGS["mamba"], [1000, 40], {0: [[0, 1, 2, 4], [0, 4]]}, None, [80, 16]),
    # an eagle sliding drafter (window 40: 3 chunks) pops: the pair scan from 144 meets pair misses at chunks 8 (key
    # 160 missing), 5 and 4 (key 96 missing) and finds the pairs 3, 2, 1: hit 64 (vLLM: 64), not the plain run at 80
    "an_eagle_pair_scan_with_a_miss_at_its_top": (
        _eagle_sliding(40), [161], {0: 12, 1: [0, 1, 2, 3, 4, 6, 7, 8]}, None, [64]),
    # an eagle sliding drafter of one chunk (window 16), 1000 tokens over an 8-chunk matrix: the pair scan jumps to the
    # matrix end, where pair 7 is never held (chunk 8 is past it): pair 6 serves 112 (vLLM: 112), not 128
    "an_eagle_pair_scan_jumping_to_the_matrix_end": (
        _eagle_sliding(16), [1000], {0: 62, 1: list(range(8))}, None, [112]),
    # an eagle sliding drafter (window 33, C = 32: a run needs 2 chunks) holding chunks 8 and 9 only: the pair scan
    # from 544 reads 8 pair misses in its first numpy window (the last one, pair 9, as well) and then the lone pair
    # 8, too short: no hit (vLLM: 0), not the plain run of chunks 8, 9 at 320
    "an_eagle_pair_scan_whose_numpy_window_ends_on_a_miss": (
        _eagle_sliding(33, k=2), [590], {0: 36, 1: ([8, 9], 36)}, None, [0]),
    # an eagle sliding drafter of window 70 holding chunks 1-5 and 8-11: pairs 1-4 and 8-10 are held, each run shorter
    # than the window needs: no hit (vLLM: 0); the miss at pair 11 lies at the end of the first numpy window
    "an_eagle_pair_scan_with_short_runs_across_numpy_windows": (
        _eagle_sliding(70), [279], {0: 17, 1: ([1, 2, 3, 4, 5, 8, 9, 10, 11], 17)}, None, [0]),
}


@pytest.mark.parametrize("name", list(SCAN_ROWS))
def test_windowed_scan_rows_equal_the_scalar_and_vllm(name):
    """``held`` per group: a column count (every key held), chunk indices held (one request), one list per request,
    or (chunk indices, column count); chunk ``j`` is the key ending at ``(j + 1) * C``, the matrix ends after the last
    held chunk unless a column count is given."""
    cfg, n, held, mnn, want = SCAN_ROWS[name]
    geom = kvgeom.resolve(cfg)
    H = geom.hash_block_size
    stored = {}
    for og in geom.offload.groups:
        spec = held[og.index]
        hpc = og.hashes_per_chunk
        if isinstance(spec, int):
            stored[og.index] = np.ones((len(n), spec), dtype=bool)
            continue
        spec, width = spec if isinstance(spec, tuple) else (spec, None)
        rows = spec if spec and isinstance(spec[0], list) else [spec] * len(n)
        width = width or (max(max(r, default=0) for r in rows) + 1) * hpc
        m = np.zeros((len(n), width), dtype=bool)
        for i, r in enumerate(rows):
            m[i, [(j + 1) * hpc - 1 for j in r]] = True
        stored[og.index] = m
    h = batch.lookup_hits(geom, n, stored=stored, max_num_new_tokens=mnn)
    assert h.hit_tokens.tolist() == want
    for i, x in enumerate(n):
        ends = {g: [(c + 1) * H for c in np.flatnonzero(m[i])] for g, m in stored.items()}
        assert h.hit(i) == hits.lookup_hit(geom, x, stored=ends, max_num_new_tokens=mnn), i


# -- the eagle re-pop after a Mamba re-alignment (72a56c6), batch side. The two vLLM-pinned rows (no hit) are
# tests/test_hits_edges.py::test_an_eagle_window_pops_again_after_the_mamba_realignment_lowers_its_run, which also
# checks batch.lookup_hits against the scalar (they kill lookup_views 341, 358, 359, 361); the row here adds
# holes in every group under a max_num_new_tokens clamp.
_SWA_DRAFTER_M32 = {
    "groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 24, "drafter": True},
               {"kind": "mamba", "block_size": 32}],
    "cache": {"retention_interval": None}, "offload": {},
    "speculative": {"method": "eagle", "num_speculative_tokens": 2},
}


def test_an_eagle_window_pops_again_after_the_full_group_lowers_it_as_the_scalar():
    # the same geometry, 216 tokens, max_num_new_tokens 136 (candidate 135), holes in each group (the drafter misses
    # key 48, the Mamba group keys 64, 96, 112 and 128, full attention key 128); the scalar lookup_hit (the oracle,
    # pinned against vLLM 0.33 by the scalar rows named above and the 1,280-lookup sweep of 72a56c6) finds no hit;
    # found by an in-process differential search over this geometry against mutants of the eagle reset (issue 19)
    geom = kvgeom.resolve(_SWA_DRAFTER_M32)
    H = geom.hash_block_size
    n, mnn = 216, 136
    stored = {0: [16, 32, 48, 64, 80, 96, 112, 144, 160, 176, 192, 208],
              1: [16, 32, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208],
              2: [16, 32, 48, 80, 144, 160, 176, 192, 208]}
    held = {g: np.array([[(i + 1) * H in ends for i in range(n // H)]]) for g, ends in stored.items()}
    scalar = hits.lookup_hit(geom, n, stored=stored, max_num_new_tokens=mnn)
    assert scalar.hit_tokens == 0
    assert batch.lookup_hits(geom, [n], stored=held, max_num_new_tokens=mnn).hit(0) == scalar


# -- a local prefix off the chunk grid (issue 19's mutation pass): the oracle is the scalar lookup_hit (the batch
# twin's, itself pinned against vLLM 0.33); the expected hit is written out: no offload hit past the local prefix.
LOCAL_OFF_GRID_ROWS = {
    # sliding window 33 (C = 16), 64 tokens, local 48, max_num_new_tokens 150: the candidate is min(63, 48 + 150)
    # = 63, on the grid 48 = the local prefix: no hit, although key 64 is held by both groups
    "a_max_num_new_tokens_clamp_above_the_request": (CONFIGS["sliding"], 64, 48, 150, {0: [32, 48, 64], 1: [64]}),
    # full attention alone, two blocks per chunk (C = 32), local 48, keys 16 and 64 held: the run of chunk 1 ends at
    # 64, less than one chunk past the local prefix: no hit
    "a_run_ending_less_than_a_chunk_past_the_local_prefix": (
        {"groups": [FA16], "offload": {"blocks_per_chunk": 2}}, 99, 48, None, {0: [16, 64]}),
}


def _one_row(geom, n, stored):
    """A one-request held matrix per group from a ``stored`` mapping of end tokens (column i: the key ending at
    ``(i + 1) * H``)."""
    H = geom.hash_block_size
    return {g: np.array([[(i + 1) * H in ends for i in range(n // H)]]) for g, ends in stored.items()}


@pytest.mark.parametrize("name", list(LOCAL_OFF_GRID_ROWS))
def test_local_prefix_rows_equal_the_scalar(name):
    cfg, n, local, mnn, stored = LOCAL_OFF_GRID_ROWS[name]
    geom = kvgeom.resolve(cfg)
    held = _one_row(geom, n, stored)
    scalar = hits.lookup_hit(geom, n, stored=stored, local_computed_tokens=local, max_num_new_tokens=mnn)
    assert (scalar.hit_tokens, scalar.end_token) == (0, local)
    got = batch.lookup_hits(geom, [n], stored=held, local_computed_tokens=[local], max_num_new_tokens=mnn)
    assert got.hit(0) == scalar


@pytest.mark.parametrize(("n", "mnn"), [(1, None), (2, 1)])
def test_one_token_chunks_with_a_window_leave_the_last_token_as_the_scalar(n, mnn):
    # blocks of one token (C = 1) and a sliding window of 1, every key held: a windowed lookup's candidate is one below
    # min(n, max_num_new_tokens), here 0, so no hit; the oracle is the scalar lookup_hit (pinned against vLLM 0.33)
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1},
                                      {"kind": "sliding_window", "block_size": 1, "sliding_window": 1}],
                           "offload": {}})
    stored = {og.index: list(range(1, n + 1)) for og in geom.offload.groups}
    held = {og.index: np.ones((1, n), dtype=bool) for og in geom.offload.groups}
    scalar = hits.lookup_hit(geom, n, stored=stored, max_num_new_tokens=mnn)
    assert scalar.hit_tokens == 0
    assert batch.lookup_hits(geom, [n], stored=held, max_num_new_tokens=mnn).hit(0) == scalar


# -- a local prefix inside a chunk (kvgeom.batch.hits.lookup_views passes the windowed scans the chunk holding the
# local prefix, c // C, as their start; issue 19's mutation pass). Two blocks per chunk (C = 32), local 26 -> 16
# (the scheduler block) or 17 -> 16: chunk 0 = tokens [0, 32) still holds 16 tokens past the local prefix, so a
# window run must reach into it. vLLM 0.33 (run_lookup_trace, run 2026-12-02, the same keys asked as
# kvgeom.hits.lookup_trace): no hit in both rows; a scan that starts half a chunk in answers 48 and 80.
LOCAL_INSIDE_A_CHUNK_ROWS = {
    # sliding window 33: a hit at 64 needs 2 chunks; the window group holds only key 64 (chunk 1), chunk 0 is missing
    "a_window_run_must_reach_the_chunk_holding_the_local_prefix": (
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}],
         "offload": {"blocks_per_chunk": 2}},
        84, 26, {0: [16, 32, 64, 80], 1: [64]}, 0),
    # an eagle sliding drafter of window 70: its pair scan finds no run of pairs long enough (keys 32 and 80 missing)
    "an_eagle_pair_scan_must_reach_the_chunk_holding_the_local_prefix": (
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 70, "drafter": True}],
         "offload": {"blocks_per_chunk": 2}, "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
        135, 17, {0: [16, 32, 48, 64, 80, 96, 112, 128], 1: [48, 64, 96, 112, 128]}, 0),
}


@pytest.mark.parametrize("name", list(LOCAL_INSIDE_A_CHUNK_ROWS))
def test_a_local_prefix_inside_a_chunk_scans_from_that_chunk_as_the_scalar_and_vllm(name):
    cfg, n, local, stored, vllm = LOCAL_INSIDE_A_CHUNK_ROWS[name]
    geom = kvgeom.resolve(cfg)
    held = _one_row(geom, n, stored)
    scalar = hits.lookup_hit(geom, n, stored=stored, local_computed_tokens=local)
    assert scalar.hit_tokens == vllm
    assert batch.lookup_hits(geom, [n], stored=held, local_computed_tokens=[local]).hit(0) == scalar


def test_an_eagle_pop_past_2_to_the_53_tokens_is_exact_as_the_scalar():
    # an eagle full-attention drafter alone with blocks of 2^30 tokens (C = H = L = 2^30), local prefix 2^53, 2^53 + 4C
    # tokens, max_num_new_tokens 2C + 1: the candidate 2^53 + 2C + 1 is odd past 2^53, where a float64 rounds; the
    # drafter pops (asks one chunk more) and holds the four chunks past the prefix, so the hit is the candidate, 2C + 1
    # tokens. The oracle is the scalar lookup_hit (Python ints); no vLLM run (a 2^53-token prefix cannot run).
    # A float pop (lookup_views mutant 132) rounds the hit to 2C.
    C = 2**30
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": C, "drafter": True}], "offload": {},
                           "speculative": {"method": "eagle", "num_speculative_tokens": 2}})
    c = 2**53
    n, mnn, first = c + 4 * C, 2 * C + 1, c // C
    held = np.zeros((1, n // C), dtype=bool)
    held[0, first:first + 4] = True
    scalar = hits.lookup_hit(geom, n, stored={0: [(j + 1) * C for j in range(first, first + 4)]},
                             local_computed_tokens=c, max_num_new_tokens=mnn)
    assert scalar.hit_tokens == 2 * C + 1
    got = batch.lookup_hits(geom, [n], stored={0: held}, local_computed_tokens=[c], max_num_new_tokens=mnn)
    assert got.hit(0) == scalar


def test_hits_fields_are_int64_and_a_bool_mask_on_every_path():
    # the Hits docstring: hit_tokens, end_token, local_computed_tokens int64 arrays, partial_tail a bool mask, whichever
    # way the lookup ended. Default geometry (FA span 32, align Mamba 16, no partial tails): requests of 0, 5 and 32
    # tokens leave no chunk past the local prefix (candidates 0, 0, 16 < 32), so the lookup returns before any scan;
    # 64 tokens every key held takes the whole path (48, as the class docstring's example and the scalar)
    geom = GEOMS["default"]
    for n in ([0, 5, 32], [64]):
        held = np.ones((len(n), 4), dtype=bool)
        h = batch.lookup_hits(geom, n, stored={0: held, 1: held})
        assert [a.dtype for a in (h.hit_tokens, h.end_token, h.local_computed_tokens)] == [np.dtype(np.int64)] * 3
        assert h.partial_tail.dtype == np.dtype(np.bool_)
        assert h.end_token[~h.partial_tail].tolist() == h.end_token.tolist()
        for i, x in enumerate(n):
            assert h.hit(i) == hits.lookup_hit(geom, x, stored={0: [32, 64], 1: [16, 32, 48, 64]})


# -- partial tails (lookup_views' tail walk): the bridge chunk a tail past the next block also loads, the key a group
# without a proof margin is asked at, the span. Rows: config, num_tokens, held end tokens per group, vLLM 0.33's hit
# (run_lookup_trace, run 2026-12-02: the same hit and the same keys as kvgeom.hits.lookup_trace). The batch twin must
# equal the scalar lookup_hit.
_TAIL_EAGLE = {"method": "eagle", "num_speculative_tokens": 2}
TAIL_LOOKUP_ROWS = {
    # eagle FA 32 drafter (proof margin 8) + Mamba 32, H 8, 40 tokens: the drafter misses key 32, so no complete chunk;
    # the top boundary is 32 = one block past 0, where the bridge chunk (key 32) is missing: the walk starts at 24 (its
    # proof key 32 missing), then 16 (proof key 24, Mamba 16 held): tail 16. Without the bridge check: tail 32.
    "a_tail_one_block_past_needs_the_bridge_chunk": (
        {"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True}, {"kind": "mamba", "block_size": 32}],
         "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {}, "speculative": _TAIL_EAGLE},
        40, {0: [8, 16, 24, 40], 1: [8, 16, 24, 32, 40]}, 16),
    # FA 32 + its eagle drafter (FA 32, margin 8) + Mamba 32, H 8, 80 tokens: FA misses key 32 (its bridge chunk), the
    # drafter holds it: the bridge needs every non-Mamba group, so the walk starts at 24 (not 56): tail 24
    "the_bridge_chunk_is_needed_of_every_attention_group": (
        {"groups": [{"kind": "full_attention", "block_size": 32},
                    {"kind": "full_attention", "block_size": 32, "drafter": True, "num_kv_heads": 4},
                    {"kind": "mamba", "block_size": 32}],
         "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {}, "speculative": _TAIL_EAGLE},
        80, {0: [8, 16, 24, 40, 48, 56, 64, 72, 80], 1: list(range(8, 81, 8)), 2: list(range(8, 81, 8))}, 24),
    # H = 1 (a one-token prefix match unit), FA 64 + Mamba 64, 2 tokens: the tail at 1 asks each group's key ending at
    # 1 (no proof margin), both held: tail 1 (a group asked at the key ending at 2 instead misses: no tail)
    "a_group_without_a_margin_is_asked_at_the_boundary": (
        {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64,
                                                                   "mamba_cache_mode": "align"}],
         "cache": {"prefix_match_unit": 1}, "offload": {}},
        2, {0: [1], 1: [1, 2]}, 1),
    # a circular buffer (never prefix-cacheable) beside an align Mamba 64, H 16: the Mamba group is the only offloaded
    # group (the span is its own); 100 tokens, Mamba keys every 16 held: chunk 64, then the tail at 96
    "a_mamba_group_offloaded_alone": (
        {"groups": [{"kind": "circular_buffer", "block_size": 64},
                    {"kind": "mamba", "block_size": 64, "mamba_cache_mode": "align"}],
         "cache": {"prefix_match_unit": 16}, "offload": {}},
        100, {1: [16, 32, 48, 64, 80, 96]}, 96),
}


@pytest.mark.parametrize("name", list(TAIL_LOOKUP_ROWS))
def test_partial_tail_rows_equal_the_scalar_and_vllm(name):
    cfg, n, stored, vllm = TAIL_LOOKUP_ROWS[name]
    geom = kvgeom.resolve(cfg)
    held = _one_row(geom, n, stored)
    scalar = hits.lookup_hit(geom, n, stored=stored)
    assert scalar.hit_tokens == vllm
    assert batch.lookup_hits(geom, [n], stored=held).hit(0) == scalar


# -- plan_stores' candidate chunks (kvgeom.batch.hits._swa_revisit_starts): which requests and groups start their
# candidates below the stored start. The plans are the scalar plan_store's; the refusal's count is kvgeom's own
# contract (plan_stores docstring: per group, each request's chunks from its stored start, or from the last partial
# alignment segment where the scalar reconsiders it, up to its storable end), derived here by hand.
def test_plan_stores_without_an_alignment_equal_the_scalar():
    # two full-attention chunks (16, 32): alignment_tokens None (a warning), so no group reconsiders a segment; a
    # finished request past its prompt, no retention, a sliding-window group: the scalar plan_store is the oracle
    geom = kvgeom.resolve({"groups": [FA16, {"kind": "full_attention", "block_size": 32},
                                      {"kind": "sliding_window", "block_size": 16, "sliding_window": 24}],
                           "cache": {"retention_interval": None}, "offload": {}})
    assert geom.offload.alignment_tokens is None
    kw = {"num_computed_tokens": 100, "num_prompt_tokens": 64, "finished": True, "offload_prompt_only": False}
    sp = batch.plan_stores(geom, num_tokens=[100], **{k: v if isinstance(v, bool) else [v] for k, v in kw.items()})
    assert sp.plan(0) == hits.plan_store(geom, num_tokens=100, **kw)


_HUGE = 2**40


@pytest.mark.parametrize(
    ("name", "computed", "finished", "total"),
    [
        # an align Mamba group (16-token chunks, under the 32-token alignment) never reconsiders a segment: request 1
        # (finished, horizon 95 tokens: 5 chunks, its prompt 3) has none, its stored start 5 being its storable end
        ("mamba_handoff", 96, True, 2**36),
        # a sliding-window group reconsiders only for a finished request: request 1 decodes (80 computed: 5 chunks,
        # stored start 5), so it has none
        ("sliding_revisit_odd", 80, False, 2**36),
        # finished (horizon 95: 5 chunks, prompt 3 chunks): its last partial alignment segment (32 tokens = 2 chunks)
        # is chunk 4 alone, reconsidered: one candidate
        ("sliding_revisit_odd", 96, True, 2**36 + 1),
    ],
)
def test_plan_stores_candidate_count_counts_reconsidered_chunks_only_where_the_scalar_does(
    name, computed, finished, total
):
    # request 0: 2^40 tokens, every group's stored start 0 but full attention's (its storable end 2^35: none there);
    # its 16-token group has 2^40 / 16 = 2^36 candidates, more than MAX_RESULT: refused, with request 1's added
    geom = GEOMS[name]
    assert [og.tokens_per_chunk for og in geom.offload.groups] == [32, 16]
    problem = None
    try:
        batch.plan_stores(geom, num_tokens=[_HUGE, 96], num_computed_tokens=[_HUGE, computed],
                          num_prompt_tokens=[_HUGE, 48], finished=[False, finished], offload_prompt_only=False,
                          stored_chunks={0: [_HUGE // 32, 2], 1: [0, 5]})
    except kvgeom.QueryError as e:
        problem = e.problems[0]
    assert problem is not None
    assert (problem.code, problem.field, problem.values["total"]) == (
        "result_too_large", "plan_stores candidate chunks", total)
    # request 1 alone: the scalar plan
    kw = {"num_computed_tokens": computed, "num_prompt_tokens": 48, "finished": finished, "offload_prompt_only": False}
    sp = batch.plan_stores(geom, num_tokens=[96], stored_chunks={0: [2], 1: [5]},
                           **{k: v if isinstance(v, bool) else [v] for k, v in kw.items()})
    assert sp.plan(0) == hits.plan_store(geom, num_tokens=96, stored_chunks={0: 2, 1: 5}, **kw)
