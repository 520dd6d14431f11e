"""Residency: the invariants of kvgeom/residency.py's module docstring, against a plain set model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.residency import Residency, make_offload_key, split_offload_key

OPS = st.lists(
    st.tuples(st.sampled_from(["add", "discard", "clear"]), st.integers(0, 2), st.sampled_from([b"a", b"b", b"c"]),
              st.integers(0, 3)),
    max_size=40,
)


@given(OPS)
def test_contains_is_the_last_update_and_clear_touches_one_holder(ops):
    r = Residency()
    model: set[tuple[int, bytes, int]] = set()
    for op, group, h, holder in ops:
        before, version = set(model), r.version
        if op == "add":
            r.add(group, h, holder)
            model.add((group, h, holder))
        elif op == "discard":
            r.discard(group, h, holder)
            model.discard((group, h, holder))
        else:
            r.clear(holder)
            model = {e for e in model if e[2] != holder}
        # version changes exactly when what is held changes
        assert (r.version != version) == (model != before)
    for group in range(3):
        for h in (b"a", b"b", b"c"):
            mask = sum(1 << holder for holder in range(4) if (group, h, holder) in model)
            assert r.holders(group, h) == mask
            assert all(r.contains(group, h, holder) == ((group, h, holder) in model) for holder in range(4))
    assert len(r) == len({(g, h) for g, h, _ in model})


def test_offload_key_round_trip_and_key_updates():
    h = b"hash".ljust(32, b".")  # vLLM's block hashes are 16 or 32 bytes (sha256: 32)
    key = make_offload_key(h, 7)
    assert split_offload_key(key) == (h, 7)
    r = Residency()
    r.add_key(key)
    assert r.contains(7, h)
    r.discard_key(key)
    assert not r.contains(7, h)


def test_probe_maps_end_tokens_to_the_chain():
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # H = 16
    r = Residency()
    r.add(0, b"h1")
    contains = r.probe(g, [b"h0", b"h1"])
    # hash i ends at (i+1)*H; off-grid and past-the-chain end tokens are never held
    assert [contains(0, 32), contains(0, 16), contains(0, 24), contains(0, 48), contains(1, 32)] == [
        True, False, False, False, False]


def test_ids_are_kept_only_for_batch_readers():
    # a reader that never asks for arrays (a router scoring on holder masks) keeps no id per hash it once held:
    # 10,000 distinct hashes stored and evicted leave nothing behind (the router branch measured 200k ids of
    # growth per 200k add/discard cycles before ids became lazy)
    from kvgeom.residency import Residency

    r = Residency()
    for i in range(10_000):
        h = i.to_bytes(8, "big")
        r.add(0, h)
        r.discard(0, h)
    assert len(r) == 0 and r.num_ids == 0
    # once a batch reader asks, every held hash has an id and later adds get one too
    r.add(0, b"a")
    assert r.held_array(0)[r.intern([b"a"])].tolist() == [True]
    r.add(0, b"b")
    assert r.held_array(0)[r.intern([b"b"])].tolist() == [True]
    r.discard(0, b"b")
    assert r.held_array(0)[r.intern([b"b"])].tolist() == [False]


def test_add_masks_equals_add_per_holder_bit_and_refuses_bad_masks():
    import pytest

    from kvgeom.errors import QueryError

    for batch_reader in (False, True):
        r, want = Residency(), Residency()
        if batch_reader:  # id arrays kept current: the masks go in bit by bit
            r.held_array(0, 1)
        r.add(0, b"a", holder=1)
        want.add(0, b"a", holder=1)
        r.add_masks(0, [b"a", b"b"], [0b101, 1 << 70])
        for h, m in ((b"a", 0b101), (b"b", 1 << 70)):
            for bit in range(m.bit_length()):
                if m >> bit & 1:
                    want.add(0, h, bit)
        assert [r.holders(0, h) for h in (b"a", b"b")] == [want.holders(0, h) for h in (b"a", b"b")] == [
            0b111, 1 << 70]
        if batch_reader:
            assert r.held_array(0, 1)[r.intern([b"a", b"b"])].tolist() == [True, False]
    v = r.version
    r.add_masks(0, [b"a"], [0b1])  # held already: nothing changes, no version step
    assert r.version == v
    with pytest.raises(QueryError) as e:
        r.add_masks(0, [b"a", b"b"], [1])
    assert e.value.code == "length_mismatch" and e.value.field == "masks"
    with pytest.raises(QueryError) as e:
        r.add_masks(0, [b"a"], [-1])
    assert e.value.code == "bad_holder" and "-1" in str(e.value)


def test_an_unhashable_block_hash_is_refused_and_the_residency_stays_usable():
    """Issue 19's thorough fuzz: ``lookup_resident(chains=[[[]]])`` raised ``TypeError: unhashable type: 'list'``
    from ``Residency.intern``. It is ``bad_block_hashes``; hashes interned before the bad one keep their ids and
    the residency's arrays stay in step with them."""
    from kvgeom.batch.lookup import lookup_resident

    r = kvgeom.Residency()
    r.add(0, b"a")
    with pytest.raises(kvgeom.QueryError) as e:
        lookup_resident(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), r, [[[]]], [16])
    assert (e.value.code, e.value.problems[0].field) == ("bad_block_hashes", "block_hashes")
    with pytest.raises(kvgeom.QueryError):
        r.intern([b"b", ["not", "hashable"]])
    ids = r.intern([b"a", b"b", b"c"]).tolist()
    assert sorted(ids) == [1, 2, 3] and r.intern([b"b", b"c"]).tolist() == ids[1:]
    r.add(0, b"c")
    assert r.contains(0, b"c") and not r.contains(0, b"b")
