"""Laws of the incremental residency index and the batch lookup that reads it (kvgeom.residency,
kvgeom.batch.lookup).

* A connector's event stream (store-complete and evict of vLLM offload key bytes, in any order,
  with repeats) leaves the Residency, its held arrays and the RequestChains equal to ones rebuilt
  from scratch from the final tier.
* ``lookup_resident`` equals the scalar ``lookup_hit`` over the same Residency (and over the
  ``stored`` end-token lists) request by request, including on an empty batch.
"""

from __future__ import annotations

import numpy as np
from _laws import H49964
from _store_strategies import chain_of, requests
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import hits
from kvgeom.batch.lookup import RequestChains, lookup_resident
from kvgeom.residency import make_offload_key
from kvgeom.strategies import geometries

_DENSE = {**H49964, "cache": {"retention_interval": None}}


def _keys(geom, chain, stored):
    H = geom.hash_block_size
    return {make_offload_key(chain[e // H - 1], g) for g, ends in stored.items() for e in ends if e // H <= len(chain)}


@st.composite
def event_streams(draw):
    """(key universe size, events): events are (op, key index) with op 'store' or 'evict'."""
    size = draw(st.integers(1, 40))
    events = draw(st.lists(st.tuples(st.sampled_from(["store", "evict"]), st.integers(0, size - 1)), max_size=120))
    return size, events


@example(stream=(3, [("store", 0), ("store", 1), ("evict", 0), ("store", 0), ("evict", 2), ("store", 2)]),
         early_arrays=True)
@given(stream=event_streams(), early_arrays=st.booleans())
def test_store_and_evict_events_keep_the_index_equal_to_a_rebuilt_one(stream, early_arrays):
    size, events = stream
    # 3 groups per hash; hashes of vLLM's xxhash size (16 bytes)
    universe = [make_offload_key((b"hash%d" % (i // 3)).ljust(16, b"."), i % 3) for i in range(size)]
    live = kvgeom.Residency()
    chains = RequestChains(live)
    if early_arrays:  # arrays asked for before the events: every update must keep them current
        for g in range(3):
            live.held_array(g)
    tier = set()
    for step, (op, k) in enumerate(events):
        key = universe[k]
        if op == "store":
            live.add_key(key)
            tier.add(key)
        else:
            live.discard_key(key)
            tier.discard(key)
        if step % 7 == 0:  # a request's chain grows while the tier changes
            chains.update("r", [(b"hash%d" % i).ljust(16, b".") for i in range(step // 7 + 1)])
    rebuilt = kvgeom.Residency()
    for key in sorted(tier):
        rebuilt.add_key(key)
    assert len(live) == len(rebuilt) == len(tier)
    for key in universe:
        h, g = key[:-4], int.from_bytes(key[-4:], "big")
        assert live.contains(g, h) == rebuilt.contains(g, h) == (key in tier)
    hashes = [(b"hash%d" % i).ljust(16, b".") for i in range(size // 3 + 1)]
    for g in range(3):
        assert (live.held_array(g)[live.intern(hashes)] == rebuilt.held_array(g)[rebuilt.intern(hashes)]).all()
    # the incrementally grown chain equals one given whole
    if len(chains):
        fresh = RequestChains(live)
        n = (len(events) - 1) // 7 + 1
        fresh.update("r", [(b"hash%d" % i).ljust(16, b".") for i in range(n)])
        assert (chains.ids[chains.rows(["r"]).rows[0], :n] == fresh.ids[fresh.rows(["r"]).rows[0], :n]).all()


@example(geom=kvgeom.resolve(_DENSE), data=None)
@given(geom=geometries(offload=True, max_block_size=16), data=st.data())
def test_lookup_resident_equals_lookup_hit_request_by_request(geom, data):
    if data is None:
        H = geom.hash_block_size
        reqs = [(97, 0, 97, None, None, {0: [32, 64], 1: list(range(H, 97, H))}), (0, 0, 0, None, None, {})]
        tracked = True
    else:
        reqs = data.draw(st.lists(requests(geom), max_size=6))
        tracked = data.draw(st.booleans())
    res = kvgeom.Residency()
    chains = RequestChains(res)
    per_req = []
    for i, req in enumerate(reqs):
        chain = chain_of(geom, req[0], salt=b"%d" % (i % 2))  # two requests share their hashes
        for key in _keys(geom, chain, req[5]):
            res.add_key(key)
        chains.update(i, chain)
        per_req.append(chain)
    # a few evictions after the chains were taken
    if reqs and data is not None:
        for key in data.draw(st.lists(st.sampled_from(sorted(_keys(geom, per_req[0], reqs[0][5]))
                                      or [b"none".ljust(20, b"0")]),
                                      max_size=3)):
            res.discard_key(key)
    n = [r[0] for r in reqs]
    local = [r[1] for r in reqs]
    prompt = [r[2] for r in reqs]
    mlt = reqs[0][3] if reqs else None
    mnn = reqs[0][4] if reqs else None
    source = chains.rows(list(range(len(reqs)))) if tracked else per_req
    got = lookup_resident(geom, res, source, n, num_prompt_tokens=prompt, local_computed_tokens=local,
                          max_load_tokens=mlt, max_num_new_tokens=mnn)
    assert len(got) == len(reqs)
    for i in range(len(reqs)):
        want = hits.lookup_hit(geom, n[i], stored=res, block_hashes=per_req[i], num_prompt_tokens=prompt[i],
                               local_computed_tokens=local[i], max_load_tokens=mlt, max_num_new_tokens=mnn)
        assert got.hit(i) == want
    # and the batch answers equal the stored end-token lists when nothing was evicted
    if data is None:
        for i, req in enumerate(reqs):
            assert got.hit(i) == hits.lookup_hit(geom, n[i], stored=req[5], num_prompt_tokens=prompt[i],
                                                 local_computed_tokens=local[i])


def test_lookup_resident_of_an_empty_batch_is_empty():
    geom = kvgeom.resolve(_DENSE)
    assert len(lookup_resident(geom, kvgeom.Residency(), [], np.zeros(0, dtype=np.int64))) == 0


@st.composite
def whole_events(draw):
    """Events as a connector's tier reports them: (op, holder, keys) with several keys of several groups,
    repeats and keys already held or absent included; a bytearray key now and then."""
    size = draw(st.integers(1, 30))
    universe = [make_offload_key(b"hash%012d" % (i // 3), i % 3) for i in range(size)]
    events = draw(st.lists(st.tuples(
        st.sampled_from(["store", "evict"]), st.integers(0, 2),
        st.lists(st.tuples(st.integers(0, size - 1), st.booleans()), max_size=12)), max_size=30))
    return universe, [(op, h, [bytearray(universe[k]) if ba else universe[k] for k, ba in ks]) for op, h, ks in events]


_A0, _A1 = make_offload_key(b"a" * 16, 0), make_offload_key(b"a" * 16, 1)  # one hash in two groups


@example(stream=([_A0, _A1], [("store", 0, [_A0, _A1, _A0]), ("evict", 0, [_A1, _A1])]),
         early_arrays=True)
@given(stream=whole_events(), early_arrays=st.booleans())
def test_a_whole_event_in_one_call_equals_its_keys_one_by_one(stream, early_arrays):
    # add_keys / discard_keys (one call per store-complete / evict event) leave the index, its version
    # count, ids and arrays exactly as add_key / discard_key key by key
    universe, events = stream
    bulk, single = kvgeom.Residency(), kvgeom.Residency()
    if early_arrays:
        for r in (bulk, single):
            for g in range(3):
                for holder in (0, 2):
                    r.held_array(g, holder)
    for op, holder, keys in events:
        if op == "store":
            bulk.add_keys(keys, holder)
            for key in keys:
                single.add_key(key, holder)
        else:
            bulk.discard_keys(keys, holder)
            for key in keys:
                single.discard_key(key, holder)
        assert bulk.version == single.version
    assert len(bulk) == len(single)
    for key in universe:
        h, g = key[:-4], int.from_bytes(key[-4:], "big")
        assert bulk.holders(g, h) == single.holders(g, h)
    hashes = sorted({key[:-4] for key in universe})
    assert bulk.intern(hashes).tolist() == single.intern(hashes).tolist()
    for g in range(3):
        for holder in (0, 2):
            assert (bulk.held_array(g, holder)[bulk.intern(hashes)]
                    == single.held_array(g, holder)[single.intern(hashes)]).all()
