"""Packed holder rows (kvgeom.holders): example rows. The law against Residency is in
tests/property/test_router_laws.py (test_packed_holders_match_the_residency)."""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom.holders import PackedHolders


def test_rows_are_words_of_64_holders():
    p = PackedHolders()
    p.add_many(0, ["a", "b"], holder=3)
    p.add_many(0, ["a"], holder=64)  # the second word appears for every group
    p.add_many(1, ["a"], holder=0)
    assert p.words == 2 and p.top_holder == 64
    assert p.rows(0, ["a", "b", "zz"]).tolist() == [[8, 1], [8, 0], [0, 0]]  # an unknown hash reads empty
    assert p.rows(1, ["a"]).tolist() == [[1, 0]]
    assert p.rows(7, ["a"]).tolist() == [[0, 0]]  # a group never seen


def test_a_hash_no_holder_holds_gives_its_row_back():
    p = PackedHolders()
    p.add_many(0, [f"h{i}" for i in range(300)], holder=1)
    p.discard_many(0, [f"h{i}" for i in range(300)], holder=1)
    assert len(p) == 0  # the sweep freed the rows
    p.add_many(0, ["new"], holder=2)  # reuses a freed row, which starts empty
    assert p.holders(0, "new") == 4 and len(p) == 1


def test_set_rows_writes_whole_masks_and_clear_drops_one_holder():
    p = PackedHolders()
    p.set_rows(0, ["a", "b"], [0b101, 1 << 130])  # holder 130: three words
    assert p.words == 3 and p.holders(0, "b") == 1 << 130
    p.clear(0)
    assert p.holders(0, "a") == 0b100 and len(p) == 2
    p.clear()
    assert len(p) == 0


def test_from_residency_is_the_same_holders():
    res = kvgeom.Residency()
    res.add_hashes(0, ["a", "b"], 70)
    res.add_hashes(2, ["b"], 1)
    p = PackedHolders.from_residency(res)
    assert [p.holders(g, h) for g in (0, 2) for h in "ab"] == [res.holders(g, h) for g in (0, 2) for h in "ab"]


@pytest.mark.parametrize("holder", [-1, True, 1.0, "0"])
def test_a_bad_holder_is_refused(holder):
    with pytest.raises(kvgeom.QueryError) as e:
        PackedHolders().add_many(0, ["a"], holder=holder)
    assert e.value.code == "bad_holder" and e.value.field == "holder"


def test_add_hashes_reports_what_the_holder_held_and_hands_over_its_masks():
    from kvgeom import Residency
    from kvgeom.holders import PackedHolders

    p, r = PackedHolders(), Residency()
    for hashes, holder in (([1, 2, 3], 5), ([2, 2, 4], 5), ([2], 200), ([7], 200), ([7], 200)):
        assert p.add_hashes(0, hashes, holder) == r.add_hashes(0, hashes, holder)
    assert p.add_hashes(0, [], 1) == []
    hashes, masks = p.held_masks(0)
    assert sorted(zip(hashes, masks, strict=True)) == sorted((h, r.holders(0, h)) for h in r.entries(0))
    assert p.held_masks(9) == ([], []) and p.groups() == (0,)


def test_add_hashes_reuses_freed_rows_before_new_ones():
    # rows given back (a hash no holder holds, after a sweep) are given out again before the matrix grows: the
    # held_masks order (row order) shows where each hash went
    p = PackedHolders()
    assert p.add_hashes(0, ["a", "b", "c"], holder=0) == []  # three new hashes: rows 1-3, one run
    p.discard_many(0, ["b"], holder=0)
    assert len(p) == 2  # the sweep gives b's row back
    assert p.add_hashes(0, ["d", "e"], holder=1) == []  # d takes b's row, e goes on the end
    assert p.held_masks(0) == (["a", "d", "c", "e"], [1, 2, 1, 2])


@pytest.mark.parametrize(
    ("event", "already"),
    [
        (["a", "b", "c", "d"], ["a", "b", "c", "d"]),  # one run of known rows, all held
        (["b", "c", "x", "y"], ["b", "c"]),  # a known run, then new hashes on the end
        (["c", "a", "b"], ["c", "a", "b"]),  # two runs out of row order
        (["a", "b", "a"], ["a", "b", "a"]),  # a row named again in a later run: held the second time too
        (["x", "x", "a"], ["x", "a"]),  # a new hash named twice: held the second time
        (["x", "y", "x", "y"], ["x", "y"]),
    ],
)
def test_add_hashes_reads_rows_by_runs_with_the_residency_contract(event, already):
    # holder 5 holds a, b, c, d (rows 1-4, stored as one event); the event's hashes are read by runs of rows
    p, res = PackedHolders(), kvgeom.Residency()
    for store in (p, res):
        store.add_hashes(0, ["a", "b", "c", "d"], holder=5)
    assert p.add_hashes(0, event, holder=5) == res.add_hashes(0, event, holder=5) == already
    assert sorted(zip(*p.held_masks(0), strict=True)) == sorted((h, res.holders(0, h)) for h in res.entries(0))
