"""Two paths, one meaning: every batch function in kvgeom.batch equals its scalar twin element by element.

For each function: over generated geometries and inputs (empty arrays, small values, int64-sized
values, values past int64 and negatives), either the scalar answers every element and the batch
returns exactly those answers, or the scalar refuses some element (or its answer does not fit an
int64) and the batch raises QueryError.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import batch, boundaries, hits, keys, ranks
from kvgeom._math import INT64_MAX
from kvgeom.errors import KVGeomError, QueryError

# ---------------------------------------------------------------------------------------------
# A small local geometry strategy (kvgeom.strategies is written on another branch).
# ---------------------------------------------------------------------------------------------

BLOCKS = st.sampled_from([8, 16, 16, 24, 32, 48, 64])


@st.composite
def configs(draw, *, offload=None, retention=None):
    dcp = draw(st.sampled_from([1, 1, 2, 4]))
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["full_attention", "mla", "sliding_window", "chunked_local", "mamba"]))
        g = {"kind": kind, "block_size": draw(BLOCKS)}
        if kind == "sliding_window":
            g["sliding_window"] = draw(st.integers(1, 200))
            g["extra_retained_tokens"] = draw(st.integers(0, 3))
        if kind == "chunked_local":
            g["attention_chunk_size"] = draw(st.sampled_from([8, 16, 32, 64, 100]))
        if kind in ("sliding_window", "chunked_local") and dcp > 1:
            g["dcp_sharded"] = False
        if kind == "mamba":
            # "all" (legacy, positional Mamba blocks) now and then; "align" is vLLM 0.33's mode
            g["mamba_cache_mode"] = draw(st.sampled_from(["align", "align", "align", "all"]))
        groups.append(g)
    cfg = {
        "groups": groups,
        "parallel": {"tp": dcp, "dcp": dcp, "cp_interleave": draw(st.sampled_from([1, 2, 8]))},
    }
    with_offload = draw(st.booleans()) if offload is None else offload
    k = draw(st.sampled_from([1, 1, 2, 3, 4]))
    if with_offload:
        cfg["offload"] = {"blocks_per_chunk": k}
    spans = [g["block_size"] * (dcp if g.get("dcp_sharded", g["kind"] in ("full_attention", "mla")) else 1)
             for g in groups]
    unit = math.lcm(*spans) * k
    if retention is None:
        retention = draw(st.sampled_from([None, 0, 0, unit, 2 * unit]))
    elif retention == "periodic":
        retention = draw(st.sampled_from([unit, 2 * unit, 3 * unit]))
    cfg["cache"] = {"retention_interval": retention}
    unit_h = draw(st.sampled_from([None, None, 8, 16]))  # a hash unit below the spans: partial tails, H != span
    if unit_h is not None:
        cfg["cache"]["prefix_match_unit"] = unit_h
    attention = [i for i, g in enumerate(groups) if g["kind"] != "mamba"]
    if attention and draw(st.integers(0, 3)) == 0:
        # a drafter (EAGLE / MTP): its groups' store masks keep one more block, one block later
        for i in draw(st.sets(st.sampled_from(attention), min_size=1)):
            groups[i]["drafter"] = True
        cfg["speculative"] = {"method": draw(st.sampled_from(["eagle", "mtp"])),
                              "num_speculative_tokens": draw(st.integers(1, 3))}
    return cfg


@st.composite
def geometries(draw, *, offload=None, retention=None):
    cfg = draw(configs(offload=offload, retention=retention))
    try:
        return kvgeom.resolve(cfg)
    except KVGeomError:
        assume(False)


@st.composite
def tail_geometries(draw):
    """Geometries with partial tails (docs/hits.md): one span, k = 1, align Mamba, H < span, D = 1."""
    block = draw(st.sampled_from([16, 32, 64]))
    attn = draw(st.sampled_from([{"kind": "full_attention"}, {"kind": "mla"}]))
    cfg = {
        "groups": [{**attn, "block_size": block}, {"kind": "mamba", "block_size": block, "mamba_cache_mode": "align"}],
        "cache": {"prefix_match_unit": draw(st.sampled_from([4, 8, block // 2])),
                  "retention_interval": draw(st.sampled_from([None, 0, block]))},
        "offload": {},
    }
    geom = kvgeom.resolve(cfg)
    assert geom.offload is not None and geom.offload.supports_partial_tail
    return geom


# Token counts: small, medium, int64-sized, and (rarely) invalid.
SMALL = st.integers(0, 300)
VALUES = st.one_of(
    SMALL,
    SMALL,
    st.integers(0, 1 << 40),
    st.integers(INT64_MAX - 4096, INT64_MAX),
)
BAD = st.sampled_from([-1, -7, INT64_MAX + 1, 1 << 64])


def value_lists(*, bad=True, max_size=8):
    elems = st.one_of(VALUES, BAD) if bad else VALUES
    return st.lists(st.one_of(VALUES, VALUES, VALUES, elems), max_size=max_size)


def scalar_all(fn, items):
    """The scalar answers, or None when the scalar refuses one or an answer does not fit int64."""
    out = []
    for x in items:
        try:
            v = fn(x)
        except KVGeomError:
            return None
        if _too_big(v):
            return None
        out.append(v)
    return out


def _too_big(v):
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, int):
        return v > INT64_MAX
    if isinstance(v, tuple | list | range):
        return any(_too_big(x) for x in v)
    return False


def check(batch_call, scalar_fn, items, convert, probe=None):
    """batch == scalar element by element, or both refuse."""
    expected = scalar_all(scalar_fn, items)
    if probe is not None:  # group-level refusals happen even on empty input
        try:
            scalar_fn(probe)
        except KVGeomError:
            expected = None
    if expected is None:
        with pytest.raises(QueryError):
            batch_call()
    else:
        assert convert(batch_call()) == expected


def group_of(geom, data):
    return data.draw(st.integers(0, len(geom.groups) - 1), label="group")


# ---------------------------------------------------------------------------------------------
# DCP dealing
# ---------------------------------------------------------------------------------------------


@given(geometries(), value_lists(), st.data())
@example(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), [], None)  # empty input
def test_placements_agree_with_dcp_placement(geom, positions, data):
    group = 0 if data is None else group_of(geom, data)

    def conv(pl):
        return [
            ranks.Placement(int(c), None if int(r) < 0 else int(r), int(o))
            for c, r, o in zip(pl.column, pl.rank, pl.offset, strict=True)
        ]

    check(lambda: batch.placements(geom, group, positions),
          lambda p: ranks.dcp_placement(geom, group, p), positions, conv)


@given(geometries(), st.data())
def test_slot_mapping_agrees_with_dcp_slot(geom, data):
    group = group_of(geom, data)
    g = geom.groups[group]
    rows = data.draw(st.integers(1, 3), label="rows")
    width = data.draw(st.integers(1, 4), label="width")
    entry = st.one_of(st.integers(0, 1000), st.integers(INT64_MAX // 64, INT64_MAX), st.just(-1))
    table = data.draw(st.lists(st.lists(entry, min_size=width, max_size=width), min_size=rows, max_size=rows))
    reach = width * g.span + g.span  # a little past the row, to hit row_too_short
    n = data.draw(st.integers(0, 12), label="n")
    positions = data.draw(st.lists(st.integers(0, reach), min_size=n, max_size=n), label="positions")
    req = data.draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n), label="request_index")
    rank = data.draw(st.none() | st.integers(0, geom.kv_shards - 1), label="rank")
    arr = np.array(table, dtype=object).astype(np.int64)

    def scalar(i):
        if i < 0:  # the probe: a group without slot mapping is refused even on empty input
            return ranks.dcp_slot(geom, group, 0, [0])[1]
        owner, slot = ranks.dcp_slot(geom, group, positions[i], table[req[i]])
        if rank is None or owner is None or owner == rank:
            return slot
        if slot > INT64_MAX:  # the batch checks every slot it computes before masking
            return slot
        return -1

    # out=: the same slots written into a caller's buffer (issue 10 item 6), which is what is returned
    out = np.full(n, 7, dtype=np.int64) if data.draw(st.booleans(), label="use_out") else None

    def run():
        got = batch.slot_mapping(geom, group, positions, arr, req, rank=rank, out=out)
        assert out is None or got is out
        return got

    check(run, scalar, list(range(n)), lambda a: a.tolist(), probe=-1)



@given(geometries(), value_lists(), st.data())
def test_batch_rank_lengths_equal_scalar_rank_lengths(geom, counts, data):
    group = group_of(geom, data)
    check(lambda: batch.rank_lengths(geom, group, counts),
          lambda n: list(ranks.rank_lengths(geom, group, n)), counts, lambda a: a.tolist())


# ---------------------------------------------------------------------------------------------
# Keys and Mamba boundaries
# ---------------------------------------------------------------------------------------------

KEY_FUNCS = [
    (batch.chunk_hash_index, keys.chunk_hash_index, 0, lambda v: v),
    (batch.chunk_end_token, keys.chunk_end_token, 0, lambda v: v),
    (batch.chunk_first_entry, keys.chunk_block_entries, 0, lambda v: v),
    (batch.chunk_state_block, keys.chunk_state_block, 0, lambda v: v),
    (batch.chunk_of_entry, keys.chunk_of_entry, 0, lambda v: v),
    (batch.chunk_for_end_token, keys.chunk_for_end_token, None, lambda v: v),
    (batch.num_keys, keys.num_keys, 0, lambda v: v),
    (batch.state_block_for_boundary, boundaries.state_block_for_boundary, None, lambda v: v),
    (batch.restore_read_block, boundaries.restore_read_block, None, lambda v: v),
    (batch.max_restorable_tokens, boundaries.max_restorable_tokens, 0, lambda v: v),
    (batch.is_restorable, boundaries.is_restorable, 0, lambda v: v),
    (functools.partial(batch.is_restorable, partial_tail=True),
     functools.partial(boundaries.is_restorable, partial_tail=True), 0, lambda v: v),
    (batch.skipped_tokens, hits.skipped_tokens, 0, lambda v: v),
]


def _name(f):
    if isinstance(f, functools.partial):
        return f.func.__name__ + "_partial_tail"
    return getattr(f, "__name__", "")


def _scalar_key(fn):
    if fn is keys.chunk_block_entries:
        return lambda geom, group, x: (lambda r: r.start if r.stop - 1 <= INT64_MAX else r.stop)(fn(geom, group, x))
    if fn is keys.chunk_for_end_token:
        return lambda geom, group, x: (lambda v: -1 if v is None else v)(fn(geom, group, x))
    return fn


@pytest.mark.parametrize("batch_fn, scalar_fn, probe, _", KEY_FUNCS, ids=_name)
@given(geom=st.one_of(geometries(), tail_geometries()), items=value_lists(), data=st.data())
def test_batch_key_and_boundary_maps_equal_the_scalar_maps(batch_fn, scalar_fn, probe, _, geom, items, data):
    group = group_of(geom, data)
    sfn = _scalar_key(scalar_fn)
    # the group-level refusal (no offload, not offloaded, not Mamba, not positional) shows on any probe
    probe_value = probe
    if probe_value is None:
        try:
            probe_value = boundaries.mamba_chunk_tokens(geom, group)
        except KVGeomError:
            probe_value = 1 if scalar_fn is not boundaries.state_block_for_boundary else geom.groups[group].block_size
    check(lambda: batch_fn(geom, group, items), lambda x: sfn(geom, group, x), items,
          lambda a: a.tolist(), probe=probe_value)


@given(geometries(), value_lists())
def test_batch_boundary_hash_index_equals_scalar(geom, items):
    check(lambda: batch.boundary_hash_index(geom, items),
          lambda x: keys.boundary_hash_index(geom, x), items, lambda a: a.tolist())


@given(geometries(), value_lists(), st.data())
def test_batch_running_state_block_equals_scalar(geom, computed, data):
    group = group_of(geom, data)
    sched = data.draw(st.lists(VALUES, min_size=len(computed), max_size=len(computed)), label="scheduled")
    pairs = list(zip(computed, sched, strict=True))

    def scalar(pair):
        a, s = pair
        if 0 <= a <= INT64_MAX and 0 <= s <= INT64_MAX and a + s > INT64_MAX:
            # the batch refuses a total past int64; the scalar accepts it as a Python int
            return INT64_MAX + 1
        return boundaries.running_state_block(geom, group, a, s)

    check(lambda: batch.running_state_block(geom, group, computed, sched), scalar, pairs,
          lambda a: a.tolist(), probe=(1, 0))


@given(geometries(offload=True), st.lists(st.integers(0, 400), max_size=6))
def test_key_maps_agree_with_key_map(geom, prefixes):
    km = batch.key_maps(geom, prefixes)
    assert [km.key_map(i) for i in range(len(prefixes))] == [keys.key_map(geom, n) for n in prefixes]


# ---------------------------------------------------------------------------------------------
# Store plans
# ---------------------------------------------------------------------------------------------


@given(geometries(offload=True), st.data())
def test_store_plans_agree_with_plan_store(geom, data):
    size = data.draw(st.integers(0, 8) | st.integers(3, 8), label="requests")
    # int64-sized counts only without periodic retention: the scalar mask lists every retained block
    # (a set of num_blocks / step entries), which for int64-sized counts does not fit in memory.
    big = not geom.config.cache.retention_interval and data.draw(st.booleans(), label="int64-sized")
    lo = INT64_MAX - (1 << 20) if big else 0
    hi = INT64_MAX if big else 6 * max(og.tokens_per_chunk for og in geom.offload.groups) + 40
    n = data.draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size), label="num_tokens")
    # usually everything is computed (a prefill that finished), else a random count
    computed = [x if data.draw(st.booleans()) else data.draw(st.integers(lo, hi), label="computed") for x in n]
    prompt = [data.draw(st.integers(0, x), label="prompt") if data.draw(st.booleans()) else x for x in n]
    if not big and size and data.draw(st.booleans(), label="zero request"):
        n[0], computed[0], prompt[0] = 0, 0, 0
    stored = {}
    for og in geom.offload.groups:
        if big:  # start near the end so the scalar loop stays short
            stored[og.index] = [max(x // og.tokens_per_chunk - data.draw(st.integers(0, 40)), 0) for x in n]
        elif data.draw(st.booleans()):
            stored[og.index] = [data.draw(st.integers(0, 6)) for _ in n]
    alloc = None
    if data.draw(st.booleans(), label="allocated"):
        alloc = {og.index: [data.draw(st.integers(0, hi // og.tokens_per_block + 2)) for _ in n]
                 for og in geom.offload.groups}
    reach = None
    if data.draw(st.booleans(), label="reachable"):
        width = data.draw(st.integers(0, 3))
        reach = [[data.draw(st.one_of(st.just(-1), st.integers(lo, hi))) for _ in range(width)] for _ in n]
    opo = data.draw(st.booleans(), label="offload_prompt_only")
    mot = data.draw(st.none() | st.integers(0, hi), label="max_offload_tokens")
    fin = [data.draw(st.booleans()) for _ in n]
    tail_stored = [data.draw(st.booleans(), label="partial_tail_stored") for _ in n]

    def scalar(i):
        return hits.plan_store(
            geom,
            num_tokens=n[i],
            num_computed_tokens=computed[i],
            num_prompt_tokens=prompt[i],
            stored_chunks={g: v[i] for g, v in stored.items()},
            allocated_blocks=None if alloc is None else {g: v[i] for g, v in alloc.items()},
            reachable=None if reach is None else tuple(t for t in reach[i] if t >= 0),
            offload_prompt_only=opo,
            max_offload_tokens=mot,
            finished=fin[i],
            partial_tail_stored=tail_stored[i],
        )

    reach_array = None if reach is None else np.array(reach, dtype=np.int64).reshape(size, len(reach[0]) if size else 0)

    def run():
        return batch.plan_stores(
            geom,
            num_tokens=n,
            num_computed_tokens=computed,
            num_prompt_tokens=prompt,
            stored_chunks=stored,
            allocated_blocks=alloc,
            reachable=None if reach is None else reach_array,
            offload_prompt_only=opo,
            max_offload_tokens=mot,
            finished=np.array(fin, dtype=bool),
            partial_tail_stored=np.array(tail_stored, dtype=bool),
        )

    def plans(sp):
        event(f"chunks stored: {any(g.chunk.size > 0 for g in sp.groups)}")
        sparse = [g for g in sp.groups if geom.groups[g.index].family in ("mamba", "sliding")]
        event(f"retention {geom.config.cache.retention_interval!r:.4}, thinned group stores: "
              f"{any(g.chunk.size > 0 for g in sparse)}")
        return [sp.plan(i) for i in range(len(sp))]

    check(run, scalar, list(range(size)), plans)


@given(st.one_of(geometries(offload=True, retention=0), geometries(offload=True, retention="periodic")), st.data())
def test_batch_store_masks_equal_scalar_near_chunk_boundaries(geom, data):
    """Masks (retention 0: reachable boundaries only; R > 0: periodic) with boundaries on and next to chunk ends."""
    C = max(og.tokens_per_chunk for og in geom.offload.groups)
    size = data.draw(st.integers(1, 6), label="requests")
    near = st.builds(lambda j, d: max(j * C + d, 0), st.integers(0, 8), st.integers(-2, 2))
    n = [data.draw(near, label="num_tokens") for _ in range(size)]
    width = data.draw(st.integers(0, 3), label="points per request")
    reach = [[data.draw(st.one_of(st.just(-1), near)) for _ in range(width)] for _ in range(size)]
    use_default = data.draw(st.booleans(), label="default reachable")
    start = {og.index: [data.draw(st.integers(0, 3)) for _ in range(size)] for og in geom.offload.groups}
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, stored_chunks=start,
                           reachable=None if use_default else np.array(reach, dtype=np.int64).reshape(size, width))
    thinned = [g for g in sp.groups if geom.groups[g.index].family in ("mamba", "sliding")]
    event(f"thinned group stores: {any(g.chunk.size > 0 for g in thinned)}")
    for i in range(size):
        pts = None if use_default else tuple(t for t in reach[i] if t >= 0)
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i],
                                             stored_chunks={g: v[i] for g, v in start.items()}, reachable=pts)


# ---------------------------------------------------------------------------------------------
# Hit lengths and load plans
# ---------------------------------------------------------------------------------------------


@given(st.one_of(geometries(offload=True), tail_geometries()), st.data())
def test_hits_and_load_plans_agree_with_lookup_hit(geom, data):
    H = geom.hash_block_size
    size = data.draw(st.integers(0, 12), label="requests")
    big = data.draw(st.integers(0, 4), label="int64-sized") == 0
    top = max(og.tokens_per_chunk for og in geom.offload.groups) * 8 + 3 * H
    width = data.draw(st.one_of(st.just(top // H + 2), st.integers(0, top // H + 2)), label="width")
    if big:
        n = [data.draw(st.integers(INT64_MAX - (1 << 16), INT64_MAX)) for _ in range(size)]
        # a local prefix close to the end keeps every scan short (the scalar scans from M down to c)
        local = [x - data.draw(st.integers(0, 4 * top)) for x in n]
    else:
        n = [data.draw(st.integers(0, top) | st.integers(top // 2, top)) for _ in range(size)]
        local = [data.draw(st.integers(0, x)) if data.draw(st.integers(0, 3)) == 0 else 0 for x in n]
    prompt = [data.draw(st.integers(0, x)) if data.draw(st.booleans()) else x for x in n]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    stored = {}
    for og in geom.offload.groups:
        if data.draw(st.integers(0, 5)):
            # per request: a held prefix of random length, then keys held with a random density
            density = rng.choice([0.0, 0.3, 0.6, 0.85, 1.0], size=(size, 1))
            prefix = rng.integers(0, width + 1, size=(size, 1))
            cols = np.arange(width)[None, :]
            stored[og.index] = (cols < prefix) | (rng.random((size, width)) < density)
    mlt = data.draw(st.none() | st.integers(0, top) | st.integers(INT64_MAX - 8, INT64_MAX), label="mlt")
    mnn = data.draw(st.none() | st.integers(0, top) | st.integers(INT64_MAX - 8, INT64_MAX), label="mnn")

    def scalar(i):
        held = {g: [(c + 1) * H for c in np.flatnonzero(m[i])] for g, m in stored.items()}
        hit = hits.lookup_hit(geom, n[i], stored=held, num_prompt_tokens=prompt[i],
                              local_computed_tokens=local[i], max_load_tokens=mlt, max_num_new_tokens=mnn)
        return hit, hits.plan_load(geom, hit)

    def run():
        h = batch.lookup_hits(geom, n, stored=stored, num_prompt_tokens=prompt, local_computed_tokens=local,
                              max_load_tokens=mlt, max_num_new_tokens=mnn)
        lp = batch.plan_loads(geom, h)
        event(f"hit > 0: {bool((h.hit_tokens > 0).any())}")
        event(f"partial tail: {bool(h.partial_tail.any())}")
        event(f"windowed groups: {sum(og.window_chunks is not None for og in geom.offload.groups)}")
        return [(h.hit(i), lp.plan(i)) for i in range(size)]

    check(run, scalar, list(range(size)), lambda v: v)


@given(st.one_of(geometries(offload=True), tail_geometries()), st.data())
def test_resident_batch_lookup_agrees_with_the_matrix_batch_and_the_scalar(geom, data):
    """batch.lookup.lookup_resident over a Residency (tier fed as vLLM offload key bytes, chains kept by
    RequestChains) == batch.lookup_hits over the same keys as bool matrices == lookup_hit per request."""
    from kvgeom.batch.lookup import RequestChains, lookup_resident

    H = geom.hash_block_size
    size = data.draw(st.integers(0, 10), label="requests")
    top = max(og.tokens_per_chunk for og in geom.offload.groups) * 8 + 3 * H
    n = [data.draw(st.integers(0, top) | st.integers(top // 2, top)) for _ in range(size)]
    local = [data.draw(st.integers(0, x)) if data.draw(st.integers(0, 3)) == 0 else 0 for x in n]
    prompt = [data.draw(st.integers(0, x)) if data.draw(st.booleans()) else x for x in n]
    width = top // H
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    stored = {}
    for og in geom.offload.groups:
        density = rng.choice([0.0, 0.3, 0.85, 1.0], size=(size, 1))
        prefix = rng.integers(0, width + 1, size=(size, 1))
        stored[og.index] = (np.arange(width)[None, :] < prefix) | (rng.random((size, width)) < density)
    tier = kvgeom.Residency()
    chains = RequestChains(tier)
    shared = data.draw(st.booleans(), label="requests share hashes")
    for i in range(size):
        chain = [(b"h%d-%d" % (0 if shared else i, j)).ljust(16, b".") for j in range(n[i] // H)]
        chains.update(i, chain)
        for g, m in stored.items():
            for col in np.flatnonzero(m[i][: len(chain)]):
                tier.add_key(kvgeom.make_offload_key(chain[col], g))
    if shared:  # one tier for all: a key held for one request is held for every request with that hash
        merged = np.zeros((size, width), dtype=bool)
        for g in stored:
            merged[:] = False
            for i in range(size):
                merged[:, : n[i] // H] |= stored[g][i, : n[i] // H]
            stored[g] = merged.copy()
    for g in stored:  # keys past a request's chain cannot be named by its hashes
        for i in range(size):
            stored[g][i, n[i] // H:] = False
    mlt = data.draw(st.none() | st.integers(0, top), label="mlt")
    got = lookup_resident(geom, tier, chains.rows(list(range(size))), n, num_prompt_tokens=prompt,
                          local_computed_tokens=local, max_load_tokens=mlt)
    want = batch.lookup_hits(geom, n, stored=stored, num_prompt_tokens=prompt, local_computed_tokens=local,
                             max_load_tokens=mlt)
    assert [got.hit(i) for i in range(size)] == [want.hit(i) for i in range(size)]
    for i in range(size):
        chain = [(b"h%d-%d" % (0 if shared else i, j)).ljust(16, b".") for j in range(n[i] // H)]
        assert got.hit(i) == hits.lookup_hit(geom, n[i], stored=tier, block_hashes=chain, num_prompt_tokens=prompt[i],
                                             local_computed_tokens=local[i], max_load_tokens=mlt)


@given(geometries(offload=True), st.sampled_from([-1, INT64_MAX + 1]))
def test_hits_refuse_values_past_int64_or_negative(geom, bad):
    with pytest.raises(QueryError):
        batch.lookup_hits(geom, [bad], stored={})
    with pytest.raises(QueryError):
        batch.plan_stores(geom, num_tokens=[bad], num_computed_tokens=[0])
