"""Laws of the lazy lookup (kvgeom.probes, kvgeom.hits.lookup_hit): every store form gives the
Hit the ``stored`` end-token lists give, and the lookup probes in vLLM's order, stopping at the
first miss.

Forms: lists (today's ``stored``), sets, a ``contains`` callable, a ``Residency`` fed with vLLM
offload key bytes + the request's hash chain, an object with the offload manager's
``lookup(key, req_context)`` (with the hash chain, or with the request's own per-group offload keys),
and bool chunk masks.
"""

from __future__ import annotations

import numpy as np
from _laws import H49964
from _spec_strategies import speculative_geometries, tail_speculative_geometries
from _store_strategies import LookupResult, Manager, chain_of, requests
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import hits
from kvgeom.residency import make_offload_key
from kvgeom.strategies import geometries

_DENSE = {**H49964, "cache": {"retention_interval": None}}
_SWA = {
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
    "cache": {"retention_interval": None},
    "offload": {},
}
_TAIL = {
    "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
    "cache": {"prefix_match_unit": 8, "retention_interval": None},
    "offload": {},
}


def _lookup(geom, req, **store):
    n, local, prompt, mlt, mnn, _ = req
    return hits.lookup_hit(geom, n, num_prompt_tokens=prompt, local_computed_tokens=local, max_load_tokens=mlt,
                           max_num_new_tokens=mnn, **store)


@example(geom=kvgeom.resolve(_DENSE), data=None)
@example(geom=kvgeom.resolve(_SWA), data=None)
@example(geom=kvgeom.resolve(_TAIL), data=None)
@given(geom=geometries(offload=True, max_block_size=16), data=st.data())
def test_every_store_form_gives_the_hit_of_the_stored_lists(geom, data):
    if data is None:  # the @example rows: a dense tier
        H = geom.hash_block_size
        req = (97, 0, 97, None, None, {og.index: list(range(H, 97, H)) for og in geom.offload.groups})
    else:
        req = data.draw(requests(geom))
    n, stored = req[0], req[5]
    expected = _lookup(geom, req, stored=stored)
    sets = {g: set(v) for g, v in stored.items()}
    assert _lookup(geom, req, stored=sets) == expected
    assert _lookup(geom, req, stored=lambda g, e: e in sets.get(g, ())) == expected
    # Residency fed with vLLM's offload key bytes; keys past the request's chain cannot be named by it
    # and are never probed (nothing past n // H * H is ever asked)
    chain = chain_of(geom, n)
    H = geom.hash_block_size
    res = kvgeom.Residency()
    keys = set()
    for g, ends in stored.items():
        for e in ends:
            if e // H <= len(chain):
                res.add_key(make_offload_key(chain[e // H - 1], g))
                keys.add(make_offload_key(chain[e // H - 1], g))
    assert _lookup(geom, req, stored=res, block_hashes=chain) == expected
    assert _lookup(geom, req, stored=Manager(keys), block_hashes=chain) == expected


@example(geom=kvgeom.resolve(_DENSE), data=None)
@given(geom=geometries(offload=True, max_block_size=16), data=st.data())
def test_bool_chunk_masks_give_the_hit_of_the_stored_lists(geom, data):
    if data is None:
        req = (97, 0, 97, None, None, {0: [32, 64, 96], 1: [16, 48, 64]})
    else:
        req = data.draw(requests(geom, chunk_grid_only=True))
    stored = req[5]
    masks = {}
    for og in geom.offload.groups:
        C = og.tokens_per_chunk
        ends = stored.get(og.index, [])
        m = np.zeros(max(ends, default=0) // C, dtype=bool)
        m[[e // C - 1 for e in ends]] = True
        masks[og.index] = m
    assert _lookup(geom, req, stored=masks) == _lookup(geom, req, stored=stored)
    # a mix: masks for some groups, end tokens for the others
    first = geom.offload.groups[0].index
    mixed = {**{g: set(v) for g, v in stored.items()}, first: masks[first]}
    assert _lookup(geom, req, stored=mixed) == _lookup(geom, req, stored=stored)


@example(geom=kvgeom.resolve(_DENSE), data=None)
@given(geom=geometries(offload=True, max_block_size=16), data=st.data())
def test_full_attention_probes_run_forward_from_the_local_prefix_and_stop_at_the_first_miss(geom, data):
    if data is None:
        req = (97, 0, 97, None, None, {0: [32, 96], 1: [16, 32, 48, 64, 80, 96]})
    else:
        req = data.draw(requests(geom))
    stored = {g: set(v) for g, v in req[5].items()}
    asked = []

    def contains(g, e):
        asked.append((g, e))
        return e in stored.get(g, ())

    hit = _lookup(geom, req, stored=contains)
    c = hit.local_computed_tokens
    H = geom.hash_block_size
    assert all(e > 0 and e % H == 0 and e <= req[0] // H * H for _, e in asked)  # on the grid, in the chain
    windowed = {og.index for og in geom.offload.groups if og.window_chunks is not None}
    if geom.offload.supports_partial_tail:
        return  # partial-tail probes follow the scans and may look like one; the stored-form law covers tails
    first_windowed = next((i for i, (g, _) in enumerate(asked) if g in windowed), len(asked))
    for og in geom.offload.groups:
        if og.index in windowed:
            continue
        C = og.tokens_per_chunk
        held = stored.get(og.index, set())
        # the group's complete-chunk scan (before any windowed group is asked): consecutive chunks
        # from chunk c // C, every one held but the last, which is the first miss or the last needed
        scan = [e for g, e in asked[:first_windowed] if g == og.index]
        assert scan == [(c // C + i + 1) * C for i in range(len(scan))]
        assert all(e in held for e in scan[:-1])


class _TriState:
    """An offload manager answering ``answers[key]`` (a LookupResult) and MISS for every other key."""

    def __init__(self, answers):
        self.answers = answers

    def lookup(self, key, req_context):
        return self.answers.get(key, LookupResult.MISS)


@given(geom=st.one_of(geometries(offload=True, max_block_size=16), speculative_geometries(offload=True),
                     tail_speculative_geometries()), data=st.data())
def test_a_lookup_that_does_not_defer_loads_what_the_settled_keys_give(geom, data):
    """Issue 19: a tier may answer HIT_PENDING or RETRY. Whenever lookup_hit does not defer
    (``lookup_not_ready``), its hit is the hit of the same tier with every unsettled key a miss: a pending or
    retried key never contributes to a hit, it only decides whether vLLM waits."""
    req = data.draw(requests(geom))
    n, stored = req[0], req[5]
    H = geom.hash_block_size
    chain = chain_of(geom, n)
    answers = {make_offload_key(chain[e // H - 1], g): LookupResult.HIT
               for g, ends in stored.items() for e in ends if 0 < e // H <= len(chain)}
    every = [make_offload_key(h, og.index) for h in chain for og in geom.offload.groups]
    if every:
        for key in data.draw(st.lists(st.sampled_from(every), max_size=4), label="unsettled keys"):
            answers[key] = data.draw(st.sampled_from([LookupResult.HIT_PENDING, LookupResult.RETRY]))
    settled = {k for k, a in answers.items() if a is LookupResult.HIT}
    try:
        hit = _lookup(geom, req, stored=_TriState(answers), block_hashes=chain)
    except kvgeom.QueryError as e:
        assert e.code == "lookup_not_ready"
        assert any(a is not LookupResult.HIT for a in answers.values())
        return
    assert hit == _lookup(geom, req, stored=Manager(settled), block_hashes=chain)


def _per_group_keys(geom, chain):
    """vLLM's per-group offload keys of a request (``RequestGroupState.offload_keys``): entry g holds
    group g's keys, chunk j's key being the chain's hash ending at ``(j + 1) * C_g`` and the group index."""
    top = max(og.index for og in geom.offload.groups) + 1
    out = [[] for _ in range(top)]
    for og in geom.offload.groups:
        hpc = og.hashes_per_chunk
        out[og.index] = [make_offload_key(chain[(j + 1) * hpc - 1], og.index) for j in range(len(chain) // hpc)]
    return out


@example(geom=kvgeom.resolve(_DENSE), data=None)
@example(geom=kvgeom.resolve(_SWA), data=None)
@example(geom=kvgeom.resolve(_TAIL), data=None)
@given(geom=st.one_of(geometries(offload=True, max_block_size=16), speculative_geometries(offload=True),
                      tail_speculative_geometries()), data=st.data())
def test_per_group_offload_keys_answer_as_the_hash_chain_and_ask_the_same_keys_in_the_same_order(geom, data):
    # A connector's own per-group keys (offload_keys=) give the Hit of the stored lists, and ask the tier
    # exactly the keys the hash-chain form asks, in the same order (lazy, stopping at the first miss).
    if data is None:
        H = geom.hash_block_size
        req = (97, 0, 97, None, None, {og.index: list(range(H, 97, H)) for og in geom.offload.groups})
    else:
        req = data.draw(requests(geom))
    n, stored = req[0], req[5]
    chain = chain_of(geom, n)
    H = geom.hash_block_size
    keys = {make_offload_key(chain[e // H - 1], g) for g, ends in stored.items() for e in ends if e // H <= len(chain)}
    per_group = _per_group_keys(geom, chain)
    by_chain, by_keys = Manager(keys), Manager(keys)
    expected = _lookup(geom, req, stored=by_chain, block_hashes=chain)
    # a geometry with partial tails keys its partial-tail key through the chain, so it passes both
    tail = {"block_hashes": chain} if geom.offload.supports_partial_tail else {}
    assert _lookup(geom, req, stored=by_keys, offload_keys=per_group, **tail) == expected
    assert _lookup(geom, req, stored=stored) == expected
    assert by_keys.asked == by_chain.asked
    # the same lists as a tuple, or as a mapping {group: keys}, answer the same
    assert _lookup(geom, req, stored=Manager(keys), offload_keys=tuple(per_group), **tail) == expected
    mapping = {og.index: per_group[og.index] for og in geom.offload.groups}
    assert _lookup(geom, req, stored=Manager(keys), offload_keys=mapping, **tail) == expected
