"""DCP token dealing (docs/keys-and-boundaries.md, which rank holds a position)."""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom import ranks
from kvgeom.errors import QueryError


def geom(interleave, dcp=2):
    return kvgeom.resolve({
        "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
        "parallel": {"tp": dcp, "dcp": dcp, "cp_interleave": interleave},
    })


ROW = [7, 9, 11]

# (interleave, position, rank, slot) -- docs/keys-and-boundaries.md, B = 16, D = 2, row [7, 9, 11]
SLOT_TABLE = [
    (1, 37, 1, 146),  # I = 1: column 1 (id 9), offset 5, rank 1, local 2 -> 9*16+2
    (1, 53, 1, 154),  # I = 1: offset 21, rank 1, local 10
    (16, 37, 0, 149),  # I = 16 (block level): rank 0, local 5
    (16, 53, 1, 149),  # I = 16: rank 1, local 5
    (1, 0, 0, 112),  # first position: rank 0, first slot of block 7
]


@pytest.mark.parametrize(("interleave", "position", "rank", "slot"), SLOT_TABLE)
def test_slots(interleave, position, rank, slot):
    assert ranks.dcp_slot(geom(interleave), 0, position, ROW) == (rank, slot)


# (interleave, n, lengths)
LENGTH_TABLE = [
    (1, 37, (19, 18)),  # example 7, I = 1
    (16, 37, (21, 16)),  # example 7, I = 16
    (1, 0, (0, 0)),  # empty sequence
    (4, 9, (5, 4)),  # I = 4: rank 0 takes 0-3 and 8, rank 1 takes 4-7
]


@pytest.mark.parametrize(("interleave", "n", "lengths"), LENGTH_TABLE)
def test_rank_lengths(interleave, n, lengths):
    assert ranks.rank_lengths(geom(interleave), 0, n) == lengths
    assert sum(lengths) == n


def test_mamba_is_not_dealt():
    # example 7: the Mamba group ignores all of this; every rank holds all positions
    g = geom(1)
    assert ranks.rank_lengths(g, 1, 37) == (37, 37)
    assert ranks.dcp_placement(g, 1, 37) == ranks.Placement(2, None, 5)
    with pytest.raises(QueryError) as info:
        ranks.dcp_slot(g, 1, 37, ROW)
    assert info.value.code == "no_slot_mapping"


def test_dcp_8_round_robin_owner_cycle():
    g = geom(1, dcp=8)
    assert [ranks.dcp_placement(g, 0, p).rank for p in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]


def test_row_too_short():
    with pytest.raises(QueryError) as info:
        ranks.dcp_slot(geom(1), 0, 100, ROW)
    assert info.value.code == "row_too_short"
