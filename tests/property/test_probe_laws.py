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
from _spec_strategies import eagle_window_geometries, speculative_geometries, tail_speculative_geometries
from _store_strategies import LookupResult, Manager, chain_of, requests
from _tiers import UnsureTier
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
_SW24_M16 = {
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 24, "sliding_window": 24}, {"kind": "mamba", "block_size": 16}],
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


_EAGLE_SW = {
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "drafter": True}],
    "cache": {"retention_interval": None},
    "offload": {},
    "speculative": {"method": "eagle", "num_speculative_tokens": 2},
}


@example(geom=kvgeom.resolve(_EAGLE_SW), data=None)  # the pair scan asked 224, 240, 208, 224, ... (issue 19)
@example(geom=kvgeom.resolve(_SWA), data=None)
@given(geom=st.one_of(eagle_window_geometries(), speculative_geometries(offload=True),
                      geometries(offload=True, max_block_size=16)), data=st.data())
def test_a_windowed_scan_asks_each_chunk_once_from_the_right(geom, data):
    """vLLM 0.33's ``_sliding_window_lookup`` asks a windowed group's keys right to left, each once per scan,
    an eagle group's widened scan too (issue 19: the pair scan asked each chunk twice, left to right within a
    pair). Two scans of one group are never adjacent (a pass asks every windowed group in turn; a lone windowed
    group is asked in one pass), so every stretch of consecutive asks of one windowed group strictly decreases.
    Partial tails ask every group per boundary after the scans: not this law's (the trace rows cover them)."""
    if data is None:
        req = (247, 0, 247, None, None, {0: list(range(16, 241, 16)),
                                         1: [16, 32, 48, 64, 96, 128, 144, 192, 208, 224, 240]})
    else:
        req = data.draw(requests(geom))
    if geom.offload.supports_partial_tail:
        return
    stored = {g: set(v) for g, v in req[5].items()}
    asked = []

    def contains(g, e):
        asked.append((g, e))
        return e in stored.get(g, ())

    assert _lookup(geom, req, stored=contains) == _lookup(geom, req, stored=req[5])
    windowed = {og.index for og in geom.offload.groups if og.window_chunks is not None}
    for i in range(1, len(asked)):
        (g0, e0), (g1, e1) = asked[i - 1], asked[i]
        if g0 == g1 and g1 in windowed:
            assert e1 < e0, (g1, [e for g, e in asked if g == g1])


@given(geom=eagle_window_geometries(), data=st.data())
def test_the_popped_window_scan_finds_the_run_of_the_pair_probe(geom, data):
    """An unverified eagle window group's scan (``hits._scan_window`` with the pop, over the raw chunks) finds
    the run the ordinary scan over :func:`kvgeom.probes.eagle_pair_held` finds (the rule, stated as a probe),
    with or without jumps over a run of misses (a set probe's ``below``), asking each chunk of
    ``[start, stop)`` at most once, right to left. A run of one chunk reaching the start has nothing left after
    the pop: the pair probe has no run there, the popped scan answers at most ``start * C`` (no hit either)."""
    og = next(o for o in geom.offload.groups if o.eagle_group and o.window_chunks is not None)
    g, C = geom.groups[og.index], og.tokens_per_chunk
    stop = data.draw(st.integers(1, 40), label="chunks the widened scan covers")
    m = data.draw(st.integers(max((stop - 2) * C + 1, C), max(stop * C, C)), label="candidate")
    start = data.draw(st.integers(0, (m - 1) // C), label="start chunk")
    held = data.draw(st.sets(st.integers(start, stop - 1)), label="held chunks")
    ends = {(j + 1) * C for j in held}
    end = min(m, (stop - 1) * C)
    for probe in (kvgeom.probes.as_probe(geom, {og.index: ends}), lambda gi, e: e in ends):
        probe = kvgeom.probes.as_probe(geom, probe)
        pairs = hits._scan_window(g, og, kvgeom.probes.eagle_pair_held(probe, C, stop * C), end, start)
        popped = hits._scan_window(g, og, probe, end, start, 1)
        assert (None if popped is None or popped <= start * C else popped) == pairs
    recorder = kvgeom.probes.RecordingProbe(kvgeom.probes.as_probe(geom, {og.index: ends}))
    assert hits._scan_window(g, og, recorder, end, start, 1) == popped
    asked = [e for _, e, _ in recorder.calls]
    assert asked == sorted(set(asked), reverse=True)
    assert all((start + 1) * C <= e <= stop * C for e in asked)


def _tri_state_answers(geom, chain, stored, data):
    """Every held key of ``stored`` answering HIT, and up to four keys of the request drawn to answer HIT_PENDING
    or RETRY instead (other keys: MISS)."""
    H = geom.hash_block_size
    answers = {make_offload_key(chain[e // H - 1], g): LookupResult.HIT
               for g, ends in stored.items() for e in ends if 0 < e // H <= len(chain)}
    every = [make_offload_key(h, og.index) for h in chain for og in geom.offload.groups]
    if every:
        for key in data.draw(st.lists(st.sampled_from(every), max_size=4), label="unsettled keys"):
            answers[key] = data.draw(st.sampled_from([LookupResult.HIT_PENDING, LookupResult.RETRY]))
    return answers


class _TriState:
    """An offload manager answering ``answers[key]`` (a LookupResult) and MISS for every other key."""

    def __init__(self, answers):
        self.answers = answers

    def lookup(self, key, req_context):
        return self.answers.get(key, LookupResult.MISS)


@given(geom=st.one_of(geometries(offload=True, max_block_size=16), speculative_geometries(offload=True),
                     tail_speculative_geometries()), data=st.data())
def test_a_lookup_that_does_not_defer_loads_no_more_than_the_settled_keys_give(geom, data):
    """Issue 19: a tier may answer HIT_PENDING or RETRY. Whenever lookup_hit does not defer
    (``lookup_not_ready``), its hit is at most the hit of the same tier with every unsettled key a miss: a
    pending or retried key never contributes to a hit. It can lower it: vLLM 0.33 keeps a full-attention group
    that met a pending key from lowering the candidate, so a later group's lowering can leave less than a miss
    would (``test_a_pending_key_can_leave_less_than_a_miss``, run on vLLM; this law once claimed equality and
    the thorough profile found that case)."""
    req = data.draw(requests(geom))
    n, stored = req[0], req[5]
    chain = chain_of(geom, n)
    answers = _tri_state_answers(geom, chain, stored, data)
    settled = {k for k, a in answers.items() if a is LookupResult.HIT}
    try:
        hit = _lookup(geom, req, stored=_TriState(answers), block_hashes=chain)
    except kvgeom.QueryError as e:
        assert e.code == "lookup_not_ready"
        assert any(a is not LookupResult.HIT for a in answers.values())
        return
    assert hit.hit_tokens <= _lookup(geom, req, stored=Manager(settled), block_hashes=chain).hit_tokens


class _AskedTriState(_TriState):
    """:class:`_TriState` recording every key it is asked, in order."""

    def __init__(self, answers):
        super().__init__(answers)
        self.asked = []

    def lookup(self, key, req_context):
        self.asked.append(key)
        return super().lookup(key, req_context)


@given(geom=st.one_of(geometries(offload=True, max_block_size=16), speculative_geometries(offload=True),
                     tail_speculative_geometries()), data=st.data())
def test_a_tier_that_defers_is_asked_the_keys_of_vllms_walk_once(geom, data):
    """Issue 19: over an offload manager answering HIT, MISS, HIT_PENDING or RETRY, the manager is asked exactly
    the keys ``lookup_trace`` lists (vLLM 0.33's walk, checked on vLLM by the pending-trace rows and sweep), in
    order, each once per time that walk asks it: the settled walk stops at the first unsettled answer and the walk
    by vLLM's rules replays the answers it was given (:class:`kvgeom.probes.Tape`). Before the tape the manager
    was asked both walks whole (a RETRY key twice). Per-group offload keys are asked the same way."""
    req = data.draw(requests(geom))
    n, local, prompt, mlt, mnn, stored = req
    options = {"num_prompt_tokens": prompt, "local_computed_tokens": local, "max_load_tokens": mlt,
               "max_num_new_tokens": mnn}
    chain = chain_of(geom, n)
    answers = _tri_state_answers(geom, chain, stored, data)
    by_chain, by_keys = _AskedTriState(answers), _AskedTriState(answers)
    try:
        trace = hits.lookup_trace(geom, n, stored=by_chain, block_hashes=chain, **options)
        hit, probes = trace.hit, trace.probes
    except kvgeom.QueryError as e:
        assert e.code == "lookup_not_ready"
        hit, probes = None, e.probes
    assert by_chain.asked == [make_offload_key(chain[p.hash_index], p.group) for p in probes]
    # the connector's own per-group keys: the same hit (or deferral) and the same calls
    tail = {"block_hashes": chain} if geom.offload.supports_partial_tail else {}
    try:
        keyed = hits.lookup_hit(geom, n, stored=by_keys, offload_keys=_per_group_keys(geom, chain), **tail, **options)
    except kvgeom.QueryError as e:
        assert e.code == "lookup_not_ready"
        keyed = None
    assert keyed == hit
    assert by_keys.asked == by_chain.asked


# max_load_tokens 81, every key held: the window group (chunk 24) is clamped to 72 and re-aligned to 64 (Mamba
# chunk 16), where its clamp would move it again (to 48); the pending walk stopped at 64 (the settled walk and
# vLLM 0.33 end at 48)
@example(geom=kvgeom.resolve(_SW24_M16), data=None)
@given(geom=st.one_of(geometries(offload=True, max_block_size=16), speculative_geometries(offload=True),
                     tail_speculative_geometries()), data=st.data())
def test_the_pending_tier_walk_over_settled_answers_asks_the_settled_walks_keys(geom, data):
    """Issue 19: over answers that are all HIT or MISS, the walk by vLLM's rules for pending answers is the
    settled walk: the same hit and the same keys, in the same order (``lookup_trace`` lists that walk). vLLM 0.33
    has one walk (``_lookup``), so the two must agree; this caught the pending walk asking a partial tail's
    bridge chunk of a group whose prefix scan had already confirmed it."""
    if data is None:  # the @example row: every chunk held, max_load_tokens 81
        req = (97, 0, 97, 81, None, {og.index: list(range(og.tokens_per_chunk, 97, og.tokens_per_chunk))
                                     for og in geom.offload.groups})
    else:
        req = data.draw(requests(geom))
    n, local, prompt, mlt, mnn, stored = req
    options = {"num_prompt_tokens": prompt, "local_computed_tokens": local, "max_load_tokens": mlt,
               "max_num_new_tokens": mnn}
    settled = hits.lookup_trace(geom, n, stored=stored, **options)
    assert hits.lookup_trace(geom, n, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored)), **options) == settled


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
